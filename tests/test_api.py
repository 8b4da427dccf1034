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
    """``tests/public_names.json`` holds the public boundary: the tables of ``jzero``,
    ``jzero.ledger`` and ``jzero.checkpoint`` (their ``_API``) as they were, each name of which must
    still import from its package. Add names to it; never drop one. The modules' own ``__all__`` are
    not the boundary: a name moved from one keeps an alias until 0.2.0 (the test below), and a name
    the docs use must exist (:func:`test_every_jzero_name_in_the_docs_exists`)."""
    import json

    held = json.loads((ROOT / "tests" / "public_names.json").read_text())
    assert set(held) == {"jzero", "jzero.ledger", "jzero.checkpoint"}
    for package, names in held.items():
        table = importlib.import_module(package)._API
        assert set(names) <= set(table), f"{package} lost {sorted(set(names) - set(table))}"
        for name in names:
            assert getattr(importlib.import_module(package), name) is resolve(f"{table[name]}.{name}")


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


def _all_modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "jzero").rglob("*.py")):
        if path.name != "__main__.py":  # importing it runs the command line
            names.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    return names


def test_every_moved_name_answers_from_its_new_home_with_a_warning():
    """Each alias a module keeps for a name that moved away (:func:`jzero.lazy.moved_names`) is the
    object at its new home, read with a ``DeprecationWarning`` that names it; it is no longer in the
    old module's ``__all__``, and the CHANGELOG names it or its old module (the aliases may go at
    0.2.0, listed there)."""
    from jzero.lazy import MOVED_NAMES

    for module in _all_modules():
        importlib.import_module(module)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert len(MOVED_NAMES) >= 10
    for module, table in ((m, t) for m, t in MOVED_NAMES.items() if m.startswith("jzero.")):
        old_home = importlib.import_module(module)
        for name, new in table.items():
            with pytest.warns(DeprecationWarning, match=rf"^{re.escape(module)}\.{name} is now {re.escape(new)}$"):
                assert getattr(old_home, name) is resolve(new), f"{module}.{name}"
            assert name not in getattr(old_home, "__all__", ()), f"{module}.{name}"  # a moved module has none
            named = re.search(rf"\b{name}\b", changelog) or f"`{module}`" in changelog
            assert named, f"the CHANGELOG names neither {module}.{name} nor its old module"
