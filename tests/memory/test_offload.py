"""ZeRO-Offload and ZeRO-R on 8 simulated devices: state in pinned host memory, remat policies and
activations partitioned over ``model``; the numbers against one device, the bytes against the plan."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.configs import LR, tiny_config
from support.reference import assert_within_floor, train_sharded

from jzero.config.loading import load_config
from jzero.ledger import hlo as ledger
from jzero.memory.offload import HOST
from jzero.memory.remat import REMAT_POLICIES, remat
from jzero.sharding.axes import LAYERS
from jzero.training.job import build_job
from jzero.training.report import plan_report


def _batches(data):
    return lambda k, sharding: data.device_batch(k, sharding)


def _kinds(tree) -> set[str]:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


@pytest.fixture(scope="module")
def jobs(data):
    """``(job, trained)`` for this module: ``job(*sets)`` the job of ``tiny_config(*sets)``, and
    ``trained(job)`` its state after ``train_sharded``'s 20 steps, each made once per config (the
    config itself is the key, however its overrides spell it). A :class:`Job` memoises its step, so
    the tests below that train or compile the same config (stage 3 with the default remat policy,
    full; the dp4-mp2 run without offload; the remat policies) trace and run it once."""
    built, states = {}, {}

    def job(*sets):
        config = tiny_config(*sets)
        key = repr(config)
        if key not in built:
            built[key] = build_job(config)
        return built[key]

    def trained(s):
        if id(s) not in states:  # the jobs are job()'s, kept in built
            states[id(s)] = train_sharded(s, _batches(data))
        return states[id(s)]

    return job, trained


OFFLOADS = {
    "stage1-optimizer": ("zero.stage=1", "zero.offload_optimizer=true"),
    "stage3-params": ("zero.stage=3", "zero.offload_params=true"),
    "stage3-both-dp4mp2": (
        "zero.stage=3", "zero.offload_params=true", "zero.offload_optimizer=true", "mesh.axes.data=4", "mesh.axes.model=2"
    ),  # fmt: skip
}


@pytest.mark.parametrize("sets", OFFLOADS.values(), ids=OFFLOADS.keys())
def test_offloaded_state_rests_in_host_memory_and_trains_like_the_same_run_without(sets, data, reference, jobs):
    job, trained = jobs
    offloaded = job(LR, *sets)
    plain = job(LR, *(x for x in sets if "offload" not in x))
    state = trained(offloaded)
    want = trained(plain)
    zero = offloaded.config.zero

    # The live arrays sit where the plan put them, optimizer state and master copy included.
    assert _kinds(state.opt_state) == ({HOST} if zero.offload_optimizer else {"device"})
    assert _kinds(state.params) == ({HOST} if zero.offload_params else {"device"})
    # 20 steps: the same parameters as without offload (measured bit-identical on this machine;
    # asserted within the one-device reference's reordering floor, which holds on any CPU).
    assert_within_floor(state.params, want.params, reference.floor.params, "params")
    reference.check(params=jax.device_get(state.params))

    # The plan: 0 device bytes for what is offloaded, its shards under host_bytes, and the compiled
    # program's host-memory arguments are exactly those.
    _, compiled = offloaded.compile_step()
    report = plan_report(offloaded, compiled)
    shards = offloaded.plan.state_bytes()
    for part, on in (("optimizer", zero.offload_optimizer), ("params", zero.offload_params)):
        assert getattr(report.per_device_bytes, part) == (0 if on else getattr(shards, part))
        assert getattr(report.host_bytes, part) == (getattr(shards, part) if on else 0)
    assert report.host_bytes.total > 0
    assert report.compiled_host.argument == report.host_bytes.total
    assert report.device_peak == report.compiled.peak - report.host_bytes.total
    # ... and what the start-up ledger measures on the live state agrees.
    host_live = ledger.live_bytes_per_device(state.opt_state, HOST) + ledger.live_bytes_per_device(state.params, HOST)
    assert host_live == report.host_bytes.total

    if zero.offload_params:
        # Device temporaries stay within one layer's gathered parameters of the run without offload.
        _, plain_compiled = plain.compile_step()
        layer = sum(t.nbytes for t in offloaded.plan.tensors if LAYERS in (t.logical or ())) // offloaded.config.model.n_layers
        assert ledger.compiled_memory(compiled)["temp"] <= ledger.compiled_memory(plain_compiled)["temp"] + layer


def test_each_block_fetches_its_own_parameters_inside_the_layer_loop(data, jobs):
    s = jobs[0]("zero.stage=3", "zero.offload_params=true")
    state = s.init_state()
    jaxpr = jax.make_jaxpr(s.make_step())(state, data.device_batch(0, s.plan.batch))

    def moves(jaxpr, inside=False):
        """(device_puts to device memory outside any loop, inside loops)."""
        out = [0, 0]
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "device_put" and any("Device" in str(d) for d in eqn.params["devices"]):
                out[inside] += len(eqn.invars)
            for sub in (v for p in eqn.params.values() for v in (p if isinstance(p, tuple | list) else (p,))):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    o = moves(inner, inside or eqn.primitive.name in ("scan", "while"))
                    out = [out[0] + o[0], out[1] + o[1]]
        return out

    outside, inside = moves(jaxpr.jaxpr)
    stacked = sum(LAYERS in (t.logical or ()) for t in s.plan.tensors)
    assert inside >= stacked  # every stacked tensor, in the forward loop (and again in the remat backward)


def test_offload_needs_the_stage_that_partitions_it():
    s = build_job(tiny_config("zero.stage=3", "zero.offload_params=true", "zero.offload_optimizer=true"))
    assert s.replan(stage=1).plan.offload_optimizer and not s.replan(stage=1).plan.offload_params
    assert not s.replan(stage=0).plan.offload_optimizer


@pytest.mark.parametrize("policy", REMAT_POLICIES)
def test_every_remat_policy_trains_like_one_device(policy, data, reference, jobs):
    job, trained = jobs
    state = trained(job(LR, "zero.stage=3", f"model.remat={policy}"))
    reference.check(params=jax.device_get(state.params))


def test_remat_policies_in_the_compiled_step(jobs):
    reports = {}
    for policy in ("none", "full", "offload_dots"):
        s = jobs[0]("zero.stage=3", f"model.remat={policy}")
        reports[policy] = plan_report(s)
    none, full, offload = reports["none"], reports["full"], reports["offload_dots"]
    # none keeps what a layer needs (tests/ledger/test_saved.py); full keeps only each layer's input.
    assert full.compiled.temp < none.compiled.temp
    assert 0 < full.activations.device < none.activations.device
    # The offloading policy asks for the saved matmul outputs in host memory. (The CPU backend
    # ignores the placement, so the ledger reads the share from the program's residuals.)
    assert offload.activations.host > 0
    assert offload.host_bytes.activations == offload.activations.host
    assert offload.activations.host > offload.activations.device


def test_true_and_false_still_mean_full_and_none():
    assert load_config(None, ["model.remat=true"]).model.remat == "full"
    assert load_config(None, ["model.remat=false"]).model.remat == "none"


def test_remat_helper_wraps_a_function_and_a_module():
    def layer(w, x):
        return jnp.tanh(x @ w)

    w, x = jnp.ones((4, 4)), jnp.ones((2, 4))
    want = jax.grad(lambda w: layer(w, x).sum())(w)
    for policy in REMAT_POLICIES:
        wrapped = remat(layer, policy)
        np.testing.assert_array_equal(jax.grad(lambda w, f=wrapped: f(w, x).sum())(w), want)
    for policy in REMAT_POLICIES:  # none too: it recomputes the elementwise work, never a matmul
        wrapped = remat(nn.Dense, policy)
        assert issubclass(wrapped, nn.Module) and wrapped is not nn.Dense


# ZeRO-R's P_a needs saved activations to dominate the temporaries: many layers, a moderate sequence,
# 8 rows per device. Measured: 64 layers give 0.67x; 16 layers 0.79x, 32 layers 0.72x (the rest is
# one layer's recomputation and the gradient, which partitioning leaves alone).
P_A = ("zero.stage=3", "mesh.axes.data=4", "mesh.axes.model=2", "model.n_layers=64", "model.d_model=256",
       "model.n_heads=4", "model.seq_len=256", "train.global_batch_size=32")  # fmt: skip


def test_partitioned_activations_divide_the_saved_inputs_by_the_model_axis():
    split, whole = (plan_report(build_job(tiny_config(*P_A, f"model.partition_activations={on}"))) for on in ("true", "false"))
    assert split.activations.partitioned and not whole.activations.partitioned
    assert split.activations.device * 2 == whole.activations.device  # N_m = 2
    # Saved: 64 layers x 8 rows x 256 x 256 float32, over N_m.
    assert whole.activations.device == 64 * 8 * 256 * 256 * 4
    assert split.compiled.temp <= 0.7 * whole.compiled.temp


def test_partitioned_activations_train_like_one_device(data, reference, jobs):
    job, trained = jobs
    s = job(LR, "zero.stage=3", "mesh.axes.data=4", "mesh.axes.model=2")
    assert s.config.model.partition_activations is None and s.config.model.partitions_activations(2)  # on by default
    state = trained(s)
    reference.check(params=jax.device_get(state.params))
