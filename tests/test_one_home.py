"""Facts written once: the stage rules live in ``jzero/sharding/stages.py`` and the ZeRO options in its one
record (:class:`jzero.sharding.stages.ZeroOptions`). Read from the source, nothing run."""

import ast
import dataclasses
import pathlib

from jzero.sharding.stages import ZeroOptions

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jzero"
RULES = PACKAGE / "sharding" / "stages.py"


def _is_stage(node: ast.AST) -> bool:
    """``stage``, ``plan.stage``, ``c.zero.stage``, ``self.stage``."""
    return (isinstance(node, ast.Name) and node.id == "stage") or (isinstance(node, ast.Attribute) and node.attr == "stage")


def _is_number(node: ast.AST) -> bool:
    """An int literal, or a tuple, list or set of them (``stage in (0, 1)``)."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return bool(node.elts) and all(_is_number(e) for e in node.elts)
    return isinstance(node, ast.Constant) and type(node.value) is int


def stage_comparisons(source: str) -> list[int]:
    """The lines that compare a stage with a number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_stage(s) for s in sides) and any(_is_number(s) for s in sides):
                found.append(node.lineno)
    return found


def test_no_stage_is_compared_with_a_number_outside_the_rule_table():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != RULES
        for line in stage_comparisons(path.read_text())
    ]
    assert found == []


def test_the_check_finds_each_form_of_a_stage_compared():
    source = "a = stage >= 3\nb = plan.stage == 0\nc = c.zero.stage in (1, 2)\nd = rule.params\ne = 3 < job.stage\n"
    assert stage_comparisons(source) == [1, 2, 3, 5]


def names(path: pathlib.Path) -> set[str]:
    """Every name, attribute, keyword and string constant in a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def test_qwz_is_named_in_at_most_three_modules():
    """The record, the report's qwZ part and the planner's search space; the config, the plan,
    ``make_plan`` and ``Job.replan`` carry the record without naming its options."""
    field = "quantized_weights"
    assert field in {f.name for f in dataclasses.fields(ZeroOptions)}
    naming = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if field in names(p))
    assert len(naming) <= 3 and "sharding/stages.py" in naming, naming


# Longer than the limits, each for a stated reason.
LONG = {
    "checkpoint/runs.py:RunCheckpoints": "Orbax's manager and the run's own layout (step folders, integrity "
    "records, rotation, the latest good step) are one object that every checkpoint reader and writer holds",
}
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 120


def _docstring_lines(node: ast.AST) -> int:
    first = node.body[0] if node.body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return first.end_lineno - first.lineno + 1 if is_doc else 0


def lengths(path: pathlib.Path) -> dict[str, tuple[int, int]]:
    """``module:name`` -> (lines, limit) of each function and class: its lines less its own docstring
    (a method's docstring counts in its class)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            name = f"{path.relative_to(PACKAGE)}:{node.name}"  # two of one name: the longer
            found[name] = max(lines, found.get(name, (0, 0))[0]), limit
    return found


def test_functions_and_classes_are_short_or_say_why():
    every = {name: n for p in sorted(PACKAGE.rglob("*.py")) for name, n in lengths(p).items()}
    assert sorted(f"{name} ({lines} lines)" for name, (lines, limit) in every.items() if lines > limit and name not in LONG) == []
    assert sorted(name for name in LONG if every[name][0] <= every[name][1]) == []  # a reason for nothing long is stale


def test_the_records_words_load_back_as_the_same_record():
    """:meth:`ZeroOptions.words` (the planner's ``--set`` overrides) read back by the config loader
    give the record itself, a list of unit regexes included."""
    from jzero.config.loading import load_config

    zero = ZeroOptions(stage=3, offload_optimizer=True, gather_units=[r"h/\d+", "embed"], prefetch=2, quantized_weights="int8")
    assert load_config(None, zero.words()).zero == zero
    assert zero.knobs() == ["offload optimizer", "qwZ int8"]


def test_a_renamed_candidate_property_still_answers_with_a_warning():
    import pytest

    from jzero.planner.candidates import Candidate

    c = Candidate(ZeroOptions(), "none", 1, 8, (("data", 4), ("model", 2)))
    with pytest.warns(DeprecationWarning, match="Candidate.axis_sizes"):
        assert c.ways == c.axis_sizes == (2, 1, 4)


def test_a_moved_loop_name_still_imports_from_its_old_place_with_a_warning():
    import pytest

    from jzero.training import loop, metrics

    for name in ("MetricsLog", "Throughput"):
        with pytest.warns(DeprecationWarning, match=f"jzero.training.metrics.{name}"):
            assert getattr(loop, name) is getattr(metrics, name)
    with pytest.raises(AttributeError):
        loop.NoSuchName  # noqa: B018


def test_the_planners_renamed_names_still_answer_with_a_warning():
    import pytest

    from jzero.planner import candidates

    for old, new in (("Figures", "EstimateInputs"), ("figures_of", "estimate_inputs")):
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(candidates, old) is getattr(candidates, new)


def test_the_state_makers_moved_from_step_still_answer_with_a_warning():
    import pytest

    import jzero
    from jzero import step
    from jzero.sharding import placement

    for name in ("abstract_state", "sharded_abstract", "sharded_init", "state_from_params", "check_precision"):
        with pytest.warns(DeprecationWarning, match=f"jzero.sharding.placement.{name}"):
            assert getattr(step, name) is getattr(placement, name)
    assert jzero.sharded_init is placement.sharded_init


def _record_classes() -> set[str]:
    """The names of the package's records: classes decorated ``@record`` (jzero.records)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(d, "id", None) == "record" for d in node.decorator_list):
                names.add(node.name)
    return names


def record_splats(source: str, records: set[str]) -> list[int]:
    """The lines that build a record from a dict by ``**``: an instrument's dict rebuilt, where the
    instrument should return the record itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in records:
                found.append(node.lineno)
    return found


def test_no_record_is_rebuilt_from_a_dict_and_no_report_goes_through_its_json():
    """Each instrument returns its record (issue 52): no ``Record(**dict)`` in the package, and no
    ``from_json`` outside its own module (the run keeps its start-up ledger's record to add the
    goodput, rather than reading ``ledger.json`` back)."""
    records = _record_classes()
    assert {"PlanReport", "Prediction", "Gathered", "StateBytes", "CompiledMemory", "GoodputReport"} <= records
    splats = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in record_splats(path.read_text(), records)
    ]
    assert not splats, splats
    assert record_splats("x = Prediction(**forecast, error=None)\ny = Prediction(step_time_s=1.0)\n", records) == [1]
    readers = sorted(
        str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py") if "from_json(" in path.read_text()
    )
    assert readers == ["jzero/records.py"], readers
