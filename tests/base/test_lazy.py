"""Names that load on first use, and names and modules that moved (:mod:`jzero.lazy`), on tables
made up here rather than jzero's own."""

import importlib
import sys
import types
import warnings

import pytest

from jzero.lazy import MOVED_NAMES, lazy_names, moved_modules, moved_names


def test_a_lazy_name_imports_its_module_on_first_use_and_is_kept():
    package = types.ModuleType("lazy_probe")
    sys.modules["lazy_probe"] = package
    try:
        package.__getattr__, package.__dir__ = lazy_names("lazy_probe", {"dumps": "json", "sqrt": "math"})
        assert "sqrt" in package.__dir__() and "dumps" in package.__dir__()
        import json

        assert package.dumps is json.dumps and vars(package)["dumps"] is json.dumps  # kept: no second lookup
        with pytest.raises(AttributeError, match="'lazy_probe' has no attribute 'loads'"):
            package.__getattr__("loads")
    finally:
        del sys.modules["lazy_probe"]


def test_a_moved_name_answers_with_its_new_home_and_a_warning():
    getter = moved_names("old.place", {"old_name": "json.dumps"})
    assert MOVED_NAMES.pop("old.place") == {"old_name": "json.dumps"}  # registered, for tests/test_api.py
    import json

    with pytest.warns(DeprecationWarning, match=r"^old\.place\.old_name is now json\.dumps$"):
        assert getter("old_name") is json.dumps
    with pytest.raises(AttributeError, match="'old.place' has no attribute 'dumps'"):
        getter("dumps")


def test_a_moved_name_may_be_an_attribute_of_a_class_in_its_new_home():
    getter = moved_names("old.place", {"build": "json.decoder.JSONDecoder.decode", "gone": "json.no_such_module.x"})
    MOVED_NAMES.pop("old.place")
    import json.decoder

    with pytest.warns(DeprecationWarning, match=r"is now json\.decoder\.JSONDecoder\.decode$"):
        assert getter("build") is json.decoder.JSONDecoder.decode
    with pytest.warns(DeprecationWarning), pytest.raises(AttributeError, match="no_such_module"):
        getter("gone")


def test_a_moved_module_imports_from_its_old_name():
    moved_modules({"jzero.lazy_probe_old_trees": "jzero.trees"})
    moved_modules({"jzero.lazy_probe_old_trees": "jzero.trees"})  # twice: one finder
    finders = [f for f in sys.meta_path if getattr(f, "table", None) == {"jzero.lazy_probe_old_trees": "jzero.trees"}]
    assert len(finders) == 1
    old = importlib.import_module("jzero.lazy_probe_old_trees")
    from jzero.trees import path_str

    with pytest.warns(DeprecationWarning, match=r"^jzero\.lazy_probe_old_trees\.path_str is now jzero\.trees\.path_str$"):
        assert old.path_str is path_str
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading the list of names warns about none
        assert "tree_paths" in dir(old)
    with pytest.raises(AttributeError):
        assert old.no_such_name
    with pytest.raises(AttributeError):
        assert old.__path__  # a module, not a package: nothing is imported beneath it
