"""The public API: one table drives ``jzero.__all__``, every ``jzero.X`` the docs name exists, and
every module says what it exports."""

import ast
import importlib
import importlib.util
import pathlib
import re

import pytest

import jzero

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"\bjzero(?:\.[A-Za-z_]\w*)+")


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def names_in_docs() -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        for match in DOTTED.finditer(page.read_text()):
            name = match.group(0)
            if not name.endswith((".py", ".yaml", ".md", ".json")):
                found.add((page.name, name))
    return sorted(found)


def test_the_table_is_the_public_api():
    assert jzero.__all__ == sorted(jzero._API)
    for name in jzero.__all__:
        assert getattr(jzero, name) is getattr(importlib.import_module(jzero._API[name]), name)
        assert name in importlib.import_module(jzero._API[name]).__all__, f"{name} is not in {jzero._API[name]}.__all__"


@pytest.mark.parametrize("package", ["jzero", "jzero.ledger", "jzero.checkpoint"])
def test_each_public_table_has_its_type_checking_mirror(package):
    """The ``if TYPE_CHECKING:`` block of a package with a public table imports exactly the table's
    names from the table's modules, so that type checkers and IDEs see what ``__getattr__`` serves."""
    module = importlib.import_module(package)
    path = pathlib.Path(module.__file__)
    block = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    mirrored = {alias.name: imp.module for imp in block.body for alias in imp.names}
    assert mirrored == module._API


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'make_plam'"):
        jzero.make_plam  # noqa: B018


def test_the_entry_points_the_docs_use_are_callable():
    for name in ("build_job", "train", "remat", "fetching", "make_plan", "make_train_step", "load_config"):
        assert callable(getattr(jzero, name)), name
    assert issubclass(jzero.TrainingHalted, jzero.RunError) and issubclass(jzero.ConfigError, jzero.JzeroError)


@pytest.mark.parametrize(("page", "name"), names_in_docs())
def test_every_jzero_name_in_the_docs_exists(page, name):
    try:
        resolve(name)
    except (AttributeError, ModuleNotFoundError) as err:
        pytest.fail(f"{page} names {name}, which does not exist ({err})")


def test_every_jzero_name_in_the_docstrings_exists():
    """Docstrings and comments name API too (``:func:`jzero.build_job```): each must exist."""
    missing = []
    for path in sorted((ROOT / "jzero").rglob("*.py")):
        for name in {m.group(0) for m in DOTTED.finditer(path.read_text())} - {"jzero.py"}:
            try:
                resolve(name)
            except (AttributeError, ModuleNotFoundError):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


@pytest.mark.parametrize("path", sorted((ROOT / "jzero").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_has_an_all_of_names_it_defines(path):
    tree = ast.parse(path.read_text())
    alls = [n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)]
    assert alls, f"{path.relative_to(ROOT)} has no __all__"
    if path.name == "__main__.py":
        return  # importing it runs the command line
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{path.relative_to(ROOT)}: __all__ names {missing}, which it does not define"


def test_every_public_name_of_before_still_imports():
    """``tests/public_names.json`` holds every module's ``__all__`` as it was before the core was
    regrouped, and those of the modules added since (the regrouped core's, the report's records):
    each name must still import from its module (a moved one with a ``DeprecationWarning`` naming
    its new home). Add names to it; never drop one."""
    import json
    import warnings

    held = json.loads((ROOT / "tests" / "public_names.json").read_text())
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for module, names in held.items():
            found = importlib.import_module(module)
            missing += [f"{module}.{name}" for name in names if not hasattr(found, name)]
    assert missing == []
    assert set(held["jzero"]) <= set(jzero.__all__) and "make_plan" in held["jzero.plan"]


def test_a_moved_module_still_imports_and_each_name_read_from_it_warns():
    """The core's modules moved into subpackages by concern: ``import jzero.plan`` still works,
    and a name read from it is the new module's, with a warning naming its new home."""
    from jzero import _MOVED

    for old, new in _MOVED.items():
        module, home = importlib.import_module(f"jzero.{old}"), importlib.import_module(f"jzero.{new}")
        name = home.__all__[0]
        with pytest.warns(DeprecationWarning, match=rf"^jzero\.{old}\.{name} is now jzero\.{new}\.{name}$"):
            assert getattr(module, name) is getattr(home, name)
    with pytest.raises(AttributeError):
        assert importlib.import_module("jzero.plan").no_such_name
    assert importlib.util.find_spec("jzero.no_such_module") is None
