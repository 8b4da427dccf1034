"""The package's layers: each module imports only its own layer or the ones below, and no import
cycle. Read from the source (every import statement, those inside functions too), nothing run."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jzero"

# Bottom first. "base" is every module directly in jzero/ but the step (errors, lazy names, trees,
# optimizers); then the core by concern; "step" is jzero/step.py, the train step over all of it.
LAYERS = [
    "base", "compiler", "memory", "communication", "sharding", "step",
    "models", "config", "data", "checkpoint", "ledger", "distributed", "training", "planner", "apps", "cli",
]  # fmt: skip
ROOT_MODULES = {"jzero.step": "step"}  # a module directly in jzero/ and not in "base"


def layer_of(module: str) -> str | None:
    """``jzero.ledger.hlo`` -> ``ledger``; ``jzero.errors`` -> ``base``; the package's face -> None."""
    parts = module.split(".")
    if module == "jzero":
        return None  # the public API table: it names modules as strings and imports none
    return parts[1] if (PACKAGE / parts[1]).is_dir() else ROOT_MODULES.get(module, "base")


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported(tree: ast.AST, importer: str) -> set[str]:
    """The jzero modules a module imports (``from jzero.ledger import hlo`` imports ``jzero.ledger.hlo``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("jzero")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jzero") and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (ROOT / sub.replace(".", "/")).is_dir()
                found.add(sub if is_module else node.module)
    found.discard(importer)
    return found


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imported(ast.parse(p.read_text()), module_name(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer, as ``importer (layer) imports imported (layer)``."""
    found = []
    for importer, targets in sorted(graph.items()):
        low = layer_of(importer)
        for target in sorted(targets):
            high = layer_of(target)
            if low is not None and high is not None and LAYERS.index(high) > LAYERS.index(low):
                found.append(f"{importer} ({low}) imports {target} ({high})")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as its modules in order, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_every_folder_of_the_package_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"base", *ROOT_MODULES.values()}


def test_nothing_imports_a_higher_layer():
    assert upward_imports(import_graph()) == []


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_checks_name_an_upward_import_and_a_cycle():
    """The two checks above on a made-up graph: they find what they are for, and name it."""
    graph = {
        "jzero.sharding.plan": {"jzero.ledger.hlo"},
        "jzero.ledger.hlo": {"jzero.ledger.render"},
        "jzero.ledger.render": {"jzero.ledger.hlo"},
    }
    assert upward_imports(graph) == ["jzero.sharding.plan (sharding) imports jzero.ledger.hlo (ledger)"]
    assert find_cycle(graph) == ["jzero.ledger.hlo", "jzero.ledger.render", "jzero.ledger.hlo"]


@pytest.mark.parametrize("module", ["jzero", "jzero.cli.main", "jzero.config.loading", "jzero.distributed.launch"])
def test_the_command_line_and_config_layers_import_no_jax(module):
    """The command line's Ctrl-C handler is in place before JAX's seconds of importing, and the
    launcher reads configs without JAX."""
    code = f"import sys, {module}; print([m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


# Modules no test imports by name, each tested through the module that reaches it: {module: (that
# module, the test file that calls it)}. The check below holds each line to the code.
REACHED_THROUGH = {
    "jzero.checkpoint.in_flight": ("jzero.checkpoint.runs", "tests/checkpoint/test_checkpoint.py"),
    "jzero.checkpoint.quiet": ("jzero.checkpoint.runs", "tests/training/test_faults.py"),
    "jzero.cli.__main__": ("jzero.cli.main", "tests/cli/test_cli.py"),  # python -m jzero.cli
    "jzero.cli.commands": ("jzero.cli.main", "tests/cli/test_cli.py"),
    "jzero.cli.parser": ("jzero.cli.main", "tests/cli/test_bad_input.py"),
    "jzero.cli.program": ("jzero.cli.main", "tests/cli/test_cli.py"),
    "jzero.communication.loss_units": ("jzero.training.job", "tests/communication/test_units.py"),
    "jzero.config.validation": ("jzero.config.loading", "tests/config/test_config.py"),
    "jzero.ledger.element_types": ("jzero.training.report", "tests/communication/test_zeropp.py"),
    "jzero.ledger.hlo_text": ("jzero.ledger.hlo", "tests/ledger/test_ledger.py"),  # the parser the readers share
    "jzero.ledger.inputs": ("jzero.ledger.plan_report", "tests/sharding/test_trainable.py"),  # what the report reads of a step
    "jzero.models.names": ("jzero.config.loading", "tests/config/test_config.py"),
    "jzero.sharding.tensor_plan": ("jzero.sharding.plan", "tests/sharding/test_plan.py"),  # make_plan's per-tensor parts
    "jzero.planner.progress": ("jzero.cli.main", "tests/planner/test_planner.py"),
    "jzero.planner.search": ("jzero.cli.main", "tests/planner/test_planner.py"),
    "jzero.planner.table": ("jzero.cli.main", "tests/planner/test_planner.py"),
    "jzero.training.initial_state": ("jzero.training.loop", "tests/training/test_loop.py"),
    "jzero.training.progress": ("jzero.training.loop", "tests/training/test_loop.py"),
}


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (a package's own ``__init__`` too)."""
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_module_has_its_tests():
    """Each module of the package is imported by a test file, or reached from a module that a named
    test file imports (the command line's modules through ``jzero.cli.main``); no stale line."""
    graph = import_graph()
    tested = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for module in imported(ast.parse(path.read_text()), ""):
            tested.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    graph["jzero.cli.main"] = graph["jzero.cli.main"] | {"jzero.cli.__main__"}  # run as python -m jzero.cli
    modules = [m for m in graph if not (PACKAGE.parent / m.replace(".", "/")).is_dir()]  # a package's face aside
    untested = sorted(m for m in modules if m not in tested and m not in REACHED_THROUGH)
    assert untested == [], "no test imports these: import each in its tests, or add it to REACHED_THROUGH"
    wrong = [
        f"{module}: {entry} from {test}"
        for module, (entry, test) in REACHED_THROUGH.items()
        if module in tested or test not in tested.get(entry, ()) or module not in reaches(graph, entry)
    ]
    assert wrong == []
