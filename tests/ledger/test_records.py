"""The plan report's records (each beside its instrument, serialised by jzero.records): real ``jzero plan --json`` outputs and a
start-up ledger validate against the generated JSON Schema, read back strictly and write back
exactly; the schema has every field of every record."""

import contextlib
import dataclasses
import functools
import io
import json
import typing

import jsonschema
import pytest
from support.cli import sets
from support.configs import BF16, CONFIG, HPZ, QWZ, TINY, tiny_config

from jzero.cli.main import main
from jzero.ledger import records
from jzero.ledger.render import format_ledger_summary, format_plan, human_bytes
from jzero.ledger.report import CheckedPlanReport, PlanReport, StagesReport
from jzero.ledger.stages_table import format_all_stages
from jzero.ledger.startup import GoodputReport, StartupLedger
from jzero.records import RecordError, from_json, json_schema, to_json
from jzero.sharding.stages import StateBytes
from jzero.training.job import build_job
from jzero.training.report import startup_ledger

# A few programs whose reports differ in shape: the plain stage 3 one; ZeRO++ (qwZ, qgZ, hpZ: the
# optional parts); offloading with a model axis (host bytes, the policy's host share); every stage
# compiled for GPUs with a verdict (predictions, asynchronous collectives, XLA options).
PLANS = {
    "stage 3": [],
    "zero++": [*sets(*QWZ, *HPZ, "zero.quantized_gradients=int8")],
    "offload": [*sets("zero.offload_optimizer=true", "model.remat=offload_dots", "mesh.axes={data: 4, model: 2}")],
    "h100x8 stages": ["--target", "h100x8", "--all-stages", "--memory-per-device", "200KiB", *sets(*BF16)],
}


@functools.cache
def plan_json(name: str) -> str:
    """``jzero plan --json``'s line for one of :data:`PLANS`, run once per test process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", CONFIG, "--json", *sets(*TINY), *PLANS[name]]) == 0
    return out.getvalue().strip()


def record_class(data: dict) -> type:
    return StagesReport if "stages" in data else CheckedPlanReport


@pytest.mark.parametrize("name", PLANS)
def test_a_plans_json_is_its_schemas_and_reads_back_exactly(name):
    text = plan_json(name)
    data = json.loads(text)
    schema = json_schema(CheckedPlanReport | StagesReport)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(data)
    record = from_json(record_class(data), data)
    assert to_json(record) == data and json.dumps(to_json(record)) == text  # the same text, byte for byte
    # The renderer reads the record read back as it reads the one the builder made.
    if isinstance(record, StagesReport):
        assert format_all_stages(record.stages).startswith("jzero plan --all-stages: mesh data=8")
    else:
        assert format_plan(record).startswith("jzero plan: ZeRO stage 3 on mesh ")


def test_all_stages_and_a_memory_budget_on_a_target():
    """--all-stages and --memory-per-device work on a GPU target as without one; the budget overrides
    the GPU's (the plan above, compiled once per test process)."""
    stages = json.loads(plan_json("h100x8 stages"))["stages"]
    assert sorted(stages) == ["0", "1", "2", "3"]
    for stage, report in stages.items():
        assert report["device_kind"] == "NVIDIA H100 80GB HBM3" and report["memory_per_device"] == 200 * 1024
        assert report["fits"] is (report["compiled"]["peak"] <= 200 * 1024)
        assert ("reduce-scatter" in report["collectives"]) is (stage != "0")
    assert stages["0"]["fits"] is False  # a budget below stage 0's model states alone
    # every compile's prediction, as jzero plan prints it, from the reports read back
    text = format_all_stages({stage: from_json(CheckedPlanReport, report) for stage, report in stages.items()})
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1].isdigit()}
    for stage, report in stages.items():
        p = report["predicted"]
        assert f"stage {stage}: step {1e3 * p['step_time_s']:.4g} ms, {p['tokens_per_sec']:,.0f} tokens/s" in text
        temp, temp0 = report["compiled"]["temp"], stages["0"]["compiled"]["temp"]  # temporaries, and against stage 0's
        assert f"{human_bytes(temp):>12} {temp / temp0:>5.2f}" in rows[stage], rows[stage]


def test_the_optional_parts_are_there_when_the_program_has_them():
    """The plans above cover the report's optional parts, so the schema test sees each one filled."""
    zeropp = from_json(CheckedPlanReport, json.loads(plan_json("zero++")))
    assert zeropp.quantization is not None and zeropp.gradient_quantization is not None and zeropp.hierarchical is not None
    assert zeropp.scaling is not None and zeropp.memory_per_device is None and zeropp.fits is None
    offload = from_json(CheckedPlanReport, json.loads(plan_json("offload")))
    assert offload.host_bytes.optimizer > 0 and offload.activations.host > 0
    stages = from_json(StagesReport, json.loads(plan_json("h100x8 stages"))).stages
    assert sorted(stages) == ["0", "1", "2", "3"]
    for report in stages.values():
        assert report.predicted is not None and report.fits is not None and report.compiler.xla_options
    assert any(report.async_collectives for report in stages.values())


def test_the_startup_ledger_is_its_schemas_and_reads_back_exactly(devices):
    job = build_job(tiny_config(), devices)
    _, compiled = job.compile_step()
    ledger = startup_ledger(job, compiled, job.init_state())
    assert isinstance(ledger, StartupLedger) and ledger.goodput is None
    data = to_json(ledger)
    assert "goodput" not in data and list(data)[-3:] == ["live_bytes_per_device", "live_host_bytes_per_device", "processes"]
    jsonschema.validate(data, json_schema(StartupLedger), cls=jsonschema.Draft202012Validator)
    assert to_json(from_json(StartupLedger, data)) == data
    assert format_ledger_summary(from_json(StartupLedger, data)) == format_ledger_summary(ledger)
    ended = dataclasses.replace(ledger, goodput=GoodputReport(wall_s=2.0, goodput=0.5, seconds={"steps": 1.0}))
    jsonschema.validate(to_json(ended), json_schema(StartupLedger), cls=jsonschema.Draft202012Validator)
    with pytest.raises(jsonschema.ValidationError):  # a plan report is not a start-up ledger
        jsonschema.validate(json.loads(plan_json("stage 3")), json_schema(StartupLedger), cls=jsonschema.Draft202012Validator)


def test_an_extra_or_a_missing_key_fails_naming_its_path():
    data = json.loads(plan_json("stage 3"))
    extra = json.loads(plan_json("stage 3"))
    extra["paper_table"]["rows"][2]["why"] = "no such key"
    with pytest.raises(RecordError, match=r"^\$\.paper_table\.rows\[2\]: unknown key 'why' for PaperRow$"):
        from_json(CheckedPlanReport, extra)
    missing = json.loads(plan_json("stage 3"))
    del missing["compiled"]["peak"]
    with pytest.raises(RecordError, match=r"^\$\.compiled: missing key 'peak' for CompiledMemory$"):
        from_json(CheckedPlanReport, missing)
    del data["memory_per_device"]
    with pytest.raises(RecordError, match=r"^\$: missing key 'memory_per_device' for CheckedPlanReport$"):
        from_json(CheckedPlanReport, data)
    stages = {"stages": {"0": {**json.loads(plan_json("stage 3")), "goodput": None}}}
    with pytest.raises(RecordError, match=r"^\$\.stages\.0: unknown key 'goodput' for CheckedPlanReport$"):
        from_json(StagesReport, stages)


def test_a_value_of_another_type_fails_naming_its_path():
    data = json.loads(plan_json("stage 3"))
    data["collectives"]["all-gather"]["count"] = "39"
    with pytest.raises(RecordError, match=r"^\$\.collectives\.all-gather\.count: expected int, got str$"):
        from_json(CheckedPlanReport, data)
    data = json.loads(plan_json("stage 3"))
    data["activations"]["partitioned"] = 0
    with pytest.raises(RecordError, match=r"^\$\.activations\.partitioned: expected bool, got int$"):
        from_json(CheckedPlanReport, data)
    data = json.loads(plan_json("stage 3"))
    data["stage"] = True  # JSON true is no stage
    with pytest.raises(RecordError, match=r"^\$\.stage: expected int, got bool$"):
        from_json(CheckedPlanReport, data)


def every_record() -> list[type]:
    """The reports' records and every record their fields hold, found through the type hints."""
    found: dict[str, type] = {}

    def walk(hint):
        if dataclasses.is_dataclass(hint) and hint.__name__ not in found:
            found[hint.__name__] = hint
            for sub in typing.get_type_hints(hint).values():
                walk(sub)
        for arg in typing.get_args(hint):
            walk(arg)

    for report in (PlanReport, CheckedPlanReport, StagesReport, StartupLedger):
        walk(report)
    return sorted(found.values(), key=lambda cls: cls.__name__)


# Records made after the move, which the old module never held.
NEWER = {"Float8", "Float8Gathers", "KeptMatmul"}


def test_every_record_is_found_and_the_old_names_warn():
    """40 records (each beside its instrument); each name of the old module still answers, with a warning."""
    found = every_record()
    assert len(found) == 40, [cls.__name__ for cls in found]
    for cls in (c for c in found if c.__name__ not in NEWER):
        with pytest.warns(DeprecationWarning, match=f"jzero.ledger.records.{cls.__name__} is now {cls.__module__}"):
            assert getattr(records, cls.__name__) is cls


@pytest.mark.parametrize("cls", every_record(), ids=lambda c: c.__name__)
def test_the_schema_lists_every_field_of_every_record_with_its_meaning(cls):
    schema = json_schema(cls)
    entry = schema["$defs"][cls.__name__]
    keys = [f.metadata.get("key", f.name) for f in dataclasses.fields(cls)]
    assert list(entry["properties"]) == keys and entry["additionalProperties"] is False
    assert entry["required"] == [k for k, f in zip(keys, dataclasses.fields(cls), strict=True) if not f.metadata.get("omit")]
    assert cls.__doc__.strip().splitlines()[0] == entry["description"]
    assert all(prop.get("description") for prop in entry["properties"].values()), cls.__name__
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_schema_types_follow_the_hints():
    defs = json_schema(PlanReport)["$defs"]
    plan = defs["PlanReport"]["properties"]
    assert plan["stage"]["type"] == "integer" and plan["backend"]["type"] == "string"
    assert plan["flops_per_device"]["anyOf"] == [{"type": "number"}, {"type": "null"}]
    assert plan["collectives"] == {
        "type": "object",
        "additionalProperties": {"$ref": "#/$defs/CollectiveKind"},
        "description": plan["collectives"]["description"],
    }
    assert plan["quantization"]["anyOf"] == [{"$ref": "#/$defs/Quantization"}, {"type": "null"}]
    assert "async" in defs["CollectiveKind"]["properties"] and defs["XlaOption"]["properties"]["value"].keys() == {"description"}
    saved = defs["SavedKind"]
    assert "role" not in saved["required"] and saved["properties"]["role"]["type"] == "string"  # absent, never null
    jsonschema.validate(3, {"type": "number"})  # a float field takes an integer


def test_json_schema_flag_prints_the_schema_without_a_config(capsys):
    with pytest.raises(SystemExit) as done:
        main(["plan", "--json-schema"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == json_schema(CheckedPlanReport | StagesReport)


def test_a_record_read_as_a_dict_still_answers_with_a_warning():
    """Instruments that returned dicts return records (issue 52): ``r["key"]`` reads the field until 0.2.0."""
    states = StateBytes.of(1, 2, 3)
    assert (states.params, states.grads, states.optimizer, states.total) == (1, 2, 3, 6)
    with pytest.warns(DeprecationWarning, match=r"^StateBytes\['total'\] is now \.total$"):
        assert states["total"] == 6
