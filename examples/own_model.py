"""Your own Flax model in jzero's training loop: ZeRO stage 3, eval, checkpoints and resume.

The model is a third party's: a GPT-2-style causal LM written as Hugging Face writes its Flax
models, blocks called one after another in a Python loop, no logical axis names, nothing of jzero.
What jzero needs from it is ``model_parts(config)``: ``init_fn(key)`` returning the fp32 parameters
and ``loss_fn(params, batch)`` returning the mean loss. ``main`` builds the job from
``configs/own-model.yaml`` (``jzero.build_job``) and trains it (``jzero.train``) with a hook of its
own; run it again with more steps and it resumes from the newest checkpoint.

    python examples/own_model.py                          # 60 steps into runs/own-model
    python examples/own_model.py --set train.steps=90     # resumes at step 60
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jzero

# ---------------------------------------------------------------------------------------------
# The model: plain linen, unannotated, knows nothing of jzero


class Attention(nn.Module):
    n_head: int

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        qkv = nn.Dense(3 * d, name="c_attn")(x).reshape(b, t, 3 * self.n_head, d // self.n_head)
        q, k, v = jnp.split(qkv, 3, axis=2)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.n_head) ** 0.5
        logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v).reshape(b, t, d)
        return nn.Dense(d, name="c_proj")(out)


class MLP(nn.Module):
    n_embd: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.n_embd, name="c_proj")(nn.gelu(nn.Dense(4 * self.n_embd, name="c_fc")(x)))


class Block(nn.Module):
    n_embd: int
    n_head: int

    @nn.compact
    def __call__(self, x):
        x = x + Attention(self.n_head, name="attn")(nn.LayerNorm(name="ln_1")(x))
        return x + MLP(self.n_embd, name="mlp")(nn.LayerNorm(name="ln_2")(x))


class BlockCollection(nn.Module):
    n_layer: int
    n_embd: int
    n_head: int

    @nn.compact
    def __call__(self, x):
        for i in range(self.n_layer):  # a Python loop: each block is its own parameters, h/0, h/1, ...
            x = Block(self.n_embd, self.n_head, name=str(i))(x)
        return x


class CausalLM(nn.Module):
    """``tokens [batch, time] -> logits [batch, time, vocab_size]``."""

    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 2

    @nn.compact
    def __call__(self, tokens):
        wte = nn.Embed(self.vocab_size, self.n_embd, name="wte")
        wpe = nn.Embed(self.n_positions, self.n_embd, name="wpe")
        x = wte(tokens) + wpe(jnp.arange(tokens.shape[1]))
        x = BlockCollection(self.n_layer, self.n_embd, self.n_head, name="h")(x)
        x = nn.LayerNorm(name="ln_f")(x)
        return nn.Dense(self.vocab_size, use_bias=False, name="lm_head")(x)


# ---------------------------------------------------------------------------------------------
# What jzero needs: init_fn and loss_fn


def model_parts(config: jzero.Config):
    """``(init_fn, loss_fn)`` for ``config``'s batch: ``model.entry`` in configs/own-model.yaml."""
    seq_len = config.model.seq_len
    model = CausalLM(vocab_size=config.model.vocab_size, n_positions=seq_len)

    def init_fn(key):
        return model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]

    def loss_fn(params, batch):  # batch: [train.global_batch_size, seq_len + 1] int32 token ids
        logits = model.apply({"params": params}, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    return init_fn, loss_fn


class EvalLog(jzero.Hook):
    """A hook of yours: keeps every logged record and prints the eval loss when there is one."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if "eval_loss" in record:
            print(f"step {record['step']}: loss {record['loss']:.3f}, eval loss {record['eval_loss']:.3f}")


def main(config_path: str = "configs/own-model.yaml", overrides: list[str] | None = None, progress: bool = True):
    config = jzero.load_config(config_path, overrides)
    init_fn, loss_fn = model_parts(config)
    job = jzero.build_job(config, init_fn=init_fn, loss_fn=loss_fn)
    for unit, tensors in job.plan.unit_tensors.items():  # stage 3 gathers one unit at a time
        print(f"unit {unit}: {len(tensors)} tensors")
    hook = EvalLog()
    result = jzero.train(config, job=job, hooks=[hook], progress=progress)
    return result, hook


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/own-model.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    result, _ = main(args.config, args.set)
    print(f"steps {result.start_step} -> {result.final_step}, saved {result.saved}")
