"""Frozen parameters (``train.trainable``): no gradient and no optimizer state at any stage, the same
parameters as one device's optax with them frozen, and the bytes and the traffic that show it."""

import math
import re

import jax
import numpy as np
import pytest
from support.configs import LR, tiny_config
from support.reference import frozen_tx, reference_with_floor

from jzero.errors import PlanError
from jzero.ledger import flops, hlo
from jzero.ledger.hlo import live_bytes_per_device
from jzero.ledger.plan_report import paper_table
from jzero.ledger.tensors import FROZEN, tensor_rows
from jzero.sharding.trainable import frozen_out, merged, trainable_mask
from jzero.training.job import build_job

TRAIN = ["blocks/(query|value)", "ln_f"]  # the queries and values of every layer, and the final norm
SET = f"train.trainable={TRAIN}"
STEPS = 5
N_D = 8


def _psi(job, trained: bool) -> int:
    """Ψ of the parameters whose path one of ``TRAIN`` finds (``trained``) or none does, counted from
    the paths and shapes alone."""
    return sum(math.prod(t.shape) for t in job.plan.tensors if any(re.search(p, t.path) for p in TRAIN) == trained)


@pytest.fixture(scope="module")
def frozen_job():
    """``job(stage, axes)``: the job with ``TRAIN`` training at a stage and mesh, built once in this
    module. A :class:`Job` memoises its step, so the bytes test compiles the step the training test
    traced at stages 0-3 on {data: 8} rather than tracing it again."""
    jobs = {}

    def job(stage, axes):
        if (stage, axes) not in jobs:
            jobs[stage, axes] = build_job(tiny_config(LR, SET, f"zero.stage={stage}", f"mesh.axes={axes}"))
        return jobs[stage, axes]

    return job


@pytest.fixture(scope="module")
def frozen_reference(data):
    one = build_job(tiny_config(LR, SET, "mesh.axes.data=1"), devices=jax.devices()[:1])
    return reference_with_floor(one.init_fn, one.loss_fn, frozen_tx(one), one.rng, lambda k: data.global_batch(k), STEPS)


@pytest.mark.parametrize(
    "stage, axes", [(0, "{data: 8}"), (1, "{data: 8}"), (2, "{data: 8}"), (3, "{data: 8}"), (3, "{data: 4, model: 2}")]
)
def test_frozen_parameters_train_like_one_device_optax_with_them_frozen(stage, axes, data, frozen_reference, frozen_job):
    """The trained parameters equal the reference's within MARGIN x its reordering floor + 4 ulps
    (support.reference); the frozen ones stay bit for bit as they were initialised. Measured with
    ``JZERO_FLOOR_LOG``: 95 leaf comparisons, every gap within 1.7x its floor, 0.15 of the tolerance
    at most."""
    s = frozen_job(stage, axes)
    state = s.init_state()
    initial = jax.device_get(state.params)
    step = s.make_step()
    for k in range(STEPS):
        state, _ = step(state, data.device_batch(k, s.plan.batch))
    frozen_reference.check(params=state.params)
    mask = jax.tree.leaves(s.plan.trainable_mask())
    assert sum(mask) == 2 + 2 + 2 and not all(mask)  # query, value (kernels and biases), ln_f's scale and bias
    for before, after, train in zip(jax.tree.leaves(initial), jax.tree.leaves(jax.device_get(state.params)), mask, strict=True):
        if not train:
            np.testing.assert_array_equal(before, after, strict=True)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_frozen_parameters_hold_no_gradient_no_optimizer_state_and_send_nothing(stage, frozen_job):
    """fp32 Adam: gradients 4Ψ_t and optimizer state 8Ψ_t (+ its two step counts), each over N_d where
    the stage partitions it, Ψ_t the trainable count; parameters 4Ψ as before. Byte for byte: the
    plan's, the live state's, and the compiled step's arguments, which hold exactly the frozen
    parameters' optimizer state less than the same model's with everything training. On the wire: at
    stage 0 the gradients' all-reduce carries 8Ψ_t bytes where the whole model's carries 8Ψ (the
    same scalars beside), and at stages 1-2 the all-gather of the updated parameters 4Ψ_t, not 4Ψ.
    At stage 0, the FLOPs the frozen weights' gradients would have cost, too."""
    frozen = frozen_job(stage, f"{{data: {N_D}}}")
    whole = build_job(tiny_config(LR, f"zero.stage={stage}", f"mesh.axes.data={N_D}"))
    psi_t, psi_f = _psi(frozen, True), _psi(frozen, False)
    assert psi_t % N_D == 0 and psi_f % N_D == 0 and 0 < psi_t < psi_f
    state = frozen.init_state()
    counts = sum(leaf.nbytes for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim == 0)
    over = {"params": N_D if stage == 3 else 1, "grads": N_D if stage >= 2 else 1, "optimizer": N_D if stage >= 1 else 1}
    want = {
        "params": 4 * (psi_t + psi_f) // over["params"],
        "grads": 4 * psi_t // over["grads"],
        "optimizer": 8 * psi_t // over["optimizer"] + counts,
    }
    assert {k: getattr(frozen.plan.per_device_bytes(), k) for k in want} == want
    assert live_bytes_per_device(state.opt_state) == want["optimizer"]
    assert frozen.plan.ideal_per_device_bytes().grads == want["grads"]
    # The report's rows: a frozen tensor has neither gradient nor optimizer spec.
    rows = {row.path: row for row in tensor_rows(frozen.plan)}
    for t in frozen.plan.tensors:
        row = rows[t.path]
        assert (row.grad_spec == FROZEN) is (row.optimizer_spec == FROZEN) is (not t.trainable), t.path
    table = paper_table(frozen.plan)  # pΨ + (g + K)Ψ_t at each stage: the counts, too, over N_d where partitioned
    assert (table.psi, table.trainable, table.k) == (psi_t + psi_f, psi_t, round((8 * psi_t + counts) / psi_t, 3))
    paper = want["params"] + want["grads"] + (8 * psi_t + counts) / over["optimizer"]
    assert table.rows[stage].bytes == paper

    (_, mine), (_, theirs) = frozen.compile_step(), whole.compile_step()
    held = theirs.memory_analysis().argument_size_in_bytes - mine.memory_analysis().argument_size_in_bytes
    assert held == 8 * psi_f // over["optimizer"]
    sent = [hlo.communication_bytes(hlo.parse_collectives(c.as_text())) for c in (mine, theirs)]
    if stage == 0:
        assert sent[0]["all-reduce"] - 8 * psi_t == sent[1]["all-reduce"] - 8 * (psi_t + psi_f) >= 0
        # Each frozen matmul weight skips its weight gradient: 2 FLOPs per weight and token, in the
        # model's FLOPs and in the compiled step's matmuls, counted from its HLO (16 x 16 tokens on 8 devices).
        kernels = sum(math.prod(t.shape) for t in frozen.plan.tensors if t.path.endswith("/kernel") and not t.trainable)
        assert whole.flops_per_token - frozen.flops_per_token == 2 * kernels
        executed = [flops.matmul_flops(c.as_text()).executed for c in (theirs, mine)]
        assert executed[0] - executed[1] == 2 * kernels * (16 * 16 // N_D)
    if stage in (1, 2):
        assert (sent[0]["all-gather"], sent[1]["all-gather"]) == (4 * psi_t, 4 * (psi_t + psi_f))


def test_the_trees_of_what_trains():
    """The mask from path regexes, the trees with frozen places empty, and the merge back."""
    params = {"blocks": {"query": {"kernel": 1.0, "bias": 2.0}, "key": {"kernel": 3.0}}, "ln_f": {"scale": 4.0}}
    mask = trainable_mask(params, ["query/kernel", "^ln_f"])
    assert mask == {"blocks": {"query": {"kernel": True, "bias": False}, "key": {"kernel": False}}, "ln_f": {"scale": True}}
    assert trainable_mask(params, None) == jax.tree.map(lambda _: True, params)
    trained = frozen_out(params, mask)
    assert trained == {"blocks": {"query": {"kernel": 1.0, "bias": None}, "key": {"kernel": None}}, "ln_f": {"scale": 4.0}}
    assert jax.tree.leaves(trained) == [1.0, 4.0]  # optax and jax.tree see only what trains
    assert merged(jax.tree.map(lambda x: -x, trained), params) == {
        "blocks": {"query": {"kernel": -1.0, "bias": 2.0}, "key": {"kernel": 3.0}}, "ln_f": {"scale": -4.0}
    }
    with pytest.raises(PlanError, match=r"^train\.trainable\[0\]: bad regex '\('"):
        trainable_mask(params, ["("])


def test_a_pattern_that_finds_no_parameter_is_refused_by_name():
    with pytest.raises(PlanError, match=r"^train\.trainable\[1\]: 'blocks/querry' matches no parameter path \(the nearest"):
        build_job(tiny_config("train.trainable=['ln_f', 'blocks/querry']"))
