"""A Flax NNX training loop on ZeRO stage 3, with tensor parallelism on a `model` axis.

NNX keeps parameters on the module; jzero trains them as a pytree. ``nnx.split`` gives the static
graph and ``nnx.state(..., nnx.Param)`` the parameters. The ``sharding`` names on the parameters
are logical; jzero's rules put ``mlp`` on ``model`` and ZeRO partitions the rest over ``data``.

    python examples/nnx_loop.py            # 8 simulated CPU devices when there is no GPU
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jzero

jax.config.update("jax_num_cpu_devices", 8)  # no GPU? 8 simulated CPU devices, before JAX starts


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, features: int = 16, hidden: int = 256):
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(features, hidden, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(hidden, 1, kernel_init=nnx.with_partitioning(init, ("mlp", None)), rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.gelu(self.up(x)))[..., 0]


def make_batch(step: int, batch_size: int = 64, features: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    x = rng.standard_normal((batch_size, features)).astype(np.float32)
    return x, np.sin(x @ np.linspace(-0.5, 0.5, features, dtype=np.float32))


def main(steps: int = 60, stage: int = 3, axes: dict | None = None) -> list[float]:
    axes = axes or {"data": 4, "model": 2}
    with nnx.use_eager_sharding(False):  # the names are logical; jzero maps them to mesh axes
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: MLP(nnx.Rngs(0))))
    tx = optax.adam(3e-3)
    key = jax.random.key(0)

    def init_fn(rng):
        return nnx.state(MLP(nnx.Rngs(rng)), nnx.Param)

    def loss_fn(params, batch):
        x, y = batch
        return jnp.mean((nnx.merge(graphdef, params)(x) - y) ** 2)

    mesh = jzero.make_mesh(axes)
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), mesh, stage)
    state = jzero.sharded_init(init_fn, tx, plan, key)
    train_step = jzero.make_train_step(loss_fn, tx, plan)

    losses = []
    for step in range(steps):
        state, metrics = train_step(state, jax.device_put(make_batch(step), plan.batch))
        losses.append(float(metrics["loss"]))
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")
    for t in plan.tensors:
        print(f"  {t.path:<12} {str(t.shape):<10} {t.param_spec}")
    return losses


if __name__ == "__main__":
    main()
