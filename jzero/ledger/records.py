"""Where the plan report's records were until 0.1: each now lives beside the instrument that makes it,
and the serialiser in :mod:`jzero.records`. The old names still import from here, with a
``DeprecationWarning`` naming the new home, until 0.2.0 (CHANGELOG.md)."""

from jzero.lazy import moved_names

__all__ = []  # every name here moved

__getattr__ = moved_names(
    __name__,
    {
        "Activations": "jzero.ledger.saved.Activations",
        "AsyncCollective": "jzero.ledger.collectives.AsyncCollective",
        "BusBandwidth": "jzero.ledger.timing.BusBandwidth",
        "CheckedPlanReport": "jzero.ledger.report.CheckedPlanReport",
        "CollectiveKind": "jzero.ledger.collectives.CollectiveKind",
        "Communication": "jzero.ledger.levels.Communication",
        "CompiledHost": "jzero.ledger.memory.CompiledHost",
        "CompiledMemory": "jzero.ledger.memory.CompiledMemory",
        "Compiler": "jzero.ledger.report.Compiler",
        "ExcludedTensor": "jzero.ledger.tensors.ExcludedTensor",
        "GatherMismatch": "jzero.ledger.element_types.GatherMismatch",
        "Gathered": "jzero.ledger.gathered.Gathered",
        "GoodputReport": "jzero.ledger.startup.GoodputReport",
        "GradientQuantization": "jzero.ledger.zeropp.GradientQuantization",
        "GradientReductions": "jzero.ledger.element_types.GradientReductions",
        "Hierarchical": "jzero.ledger.zeropp.Hierarchical",
        "HostBytes": "jzero.sharding.stages.HostBytes",
        "LiveBytes": "jzero.ledger.startup.LiveBytes",
        "LiveProcessBytes": "jzero.ledger.startup.LiveProcessBytes",
        "ModelFlops": "jzero.ledger.flops.ModelFlops",
        "PaperRow": "jzero.ledger.report.PaperRow",
        "PaperTable": "jzero.ledger.report.PaperTable",
        "ParameterGathers": "jzero.ledger.element_types.ParameterGathers",
        "PlanReport": "jzero.ledger.report.PlanReport",
        "Prediction": "jzero.ledger.timing.Prediction",
        "ProcessBytes": "jzero.ledger.startup.ProcessBytes",
        "Processes": "jzero.ledger.startup.Processes",
        "Quantization": "jzero.ledger.zeropp.Quantization",
        "RecordError": "jzero.records.RecordError",
        "ReductionMismatch": "jzero.ledger.element_types.ReductionMismatch",
        "SavedKind": "jzero.ledger.saved.SavedKind",
        "Scaling": "jzero.ledger.report.Scaling",
        "StagesReport": "jzero.ledger.report.StagesReport",
        "StartupLedger": "jzero.ledger.startup.StartupLedger",
        "StateBytes": "jzero.sharding.stages.StateBytes",
        "TensorEntry": "jzero.ledger.tensors.TensorEntry",
        "TensorRow": "jzero.ledger.tensors.TensorRow",
        "XlaOption": "jzero.ledger.report.XlaOption",
        "from_json": "jzero.records.from_json",
        "json_schema": "jzero.records.json_schema",
        "to_json": "jzero.records.to_json",
    },
)
