"""A plain Flax + optax training loop, converted to ZeRO stage 3.

The model and the loss are the user's own and know nothing of jzero. The lines marked ``# jzero``
are the whole conversion: build a mesh, plan the stage, initialise sharded, compile the step, and
put each batch on the ``data`` axis. Change ``stage`` to 0, 1 or 2 and nothing else changes.

    python examples/zero3_loop.py            # 8 simulated CPU devices when there is no GPU
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jzero

jax.config.update("jax_num_cpu_devices", 8)  # no GPU? 8 simulated CPU devices, before JAX starts


class MLP(nn.Module):
    """An ordinary, unannotated Flax model."""

    hidden: int = 256

    @nn.compact
    def __call__(self, x):
        x = nn.gelu(nn.Dense(self.hidden)(x))
        x = nn.gelu(nn.Dense(self.hidden)(x))
        return nn.Dense(1)(x)[..., 0]


def make_batch(step: int, batch_size: int = 64, features: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A fixed regression task: y = sin(x . w)."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((batch_size, features)).astype(np.float32)
    w = np.linspace(-0.5, 0.5, features, dtype=np.float32)
    return x, np.sin(x @ w)


def training_parts():
    """The user's own pieces: parameter init, loss, optimizer and seed."""
    model = MLP()

    def init_fn(rng):
        return model.init(rng, jnp.zeros((1, 16)))["params"]

    def loss_fn(params, batch):
        x, y = batch
        return jnp.mean((model.apply({"params": params}, x) - y) ** 2)

    return init_fn, loss_fn, optax.adam(3e-3), jax.random.key(0)


def main(steps: int = 60, stage: int = 3) -> list[float]:
    init_fn, loss_fn, tx, key = training_parts()
    mesh = jzero.make_mesh({"data": -1})  # jzero
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), mesh, stage)  # jzero
    state = jzero.sharded_init(init_fn, tx, plan, key)  # jzero
    train_step = jzero.make_train_step(loss_fn, tx, plan)  # jzero

    losses = []
    for step in range(steps):
        batch = jax.device_put(make_batch(step), plan.batch)  # jzero: the batch goes on `data`
        state, metrics = train_step(state, batch)
        losses.append(float(metrics["loss"]))
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")

    print(f"stage {stage} on {mesh.size} devices: {jzero.ledger.live_bytes_per_device(state):,} bytes of model state per device")
    for t in plan.replicated:
        print(f"  replicated (no dimension divisible by {plan.data_size}): {t.path} {t.shape}")
    return losses


if __name__ == "__main__":
    main()
