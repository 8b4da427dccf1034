"""A tensor's path as text (:mod:`jzero.trees`): the one spelling plans, units, checkpoints and
exports share."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jzero.trees import path_str, tree_paths


def test_dicts_lists_and_dataclasses_are_slash_separated():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Pair:
        left: jax.Array
        right: jax.Array

    tree = {"params": {"blocks": [np.zeros(2), Pair(np.ones(1), np.ones(3))]}, "step": np.int32(0)}
    paths = tree_paths(tree)
    assert list(paths) == ["params/blocks/0", "params/blocks/1/left", "params/blocks/1/right", "step"]
    assert paths["params/blocks/1/right"].shape == (3,)


def test_an_nnx_variables_value_attribute_is_left_out():
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    paths = tree_paths(nnx.state(model), is_leaf=lambda x: isinstance(x, jax.Array))
    assert sorted(paths) == ["bias", "kernel"]
    assert paths["kernel"].shape == (2, 3)


def test_a_leaf_named_value_in_a_dict_keeps_its_name():
    """Only the attribute ``.value`` (NNX's) is dropped; a dict key ``"value"`` is a real name."""
    assert list(tree_paths({"a": {"value": jnp.zeros(1)}})) == ["a/value"]
    assert path_str(()) == ""
