"""Tiny random models of each family jzero reads, written by ``transformers`` itself (PyTorch, sharded
safetensors), and their logits and greedy tokens: what the decoder is held to."""

from pathlib import Path

import numpy as np

# Every family at the same tiny width, with what sets it apart switched on: a sliding window of 6
# (shorter than the 16-token sequences and the 32 sampled tokens), explicit head sizes that are not
# d_model / n_heads, Qwen2's biases, query/key norms, Gemma's soft-caps (small enough to bend these
# logits) and Gemma 3's local rotary base and linear scaling.
_BASE = {
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
}  # fmt: skip
_WINDOW = {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
FAMILIES = {
    "qwen2": ("Qwen2ForCausalLM", {**_BASE, "use_sliding_window": True, **_WINDOW, "tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", {**_BASE, "head_dim": 24, "rope_theta": 1e6, "tie_word_embeddings": False}),
    "mistral": ("MistralForCausalLM", {**_BASE, "head_dim": 8, "sliding_window": 6}),
    "gemma2": ("Gemma2ForCausalLM", {
        **_BASE, "head_dim": 24, "query_pre_attn_scalar": 20, **_WINDOW, "attn_logit_softcapping": 1.0,
        "final_logit_softcapping": 2.0,
    }),  # fmt: skip
    "gemma3": ("Gemma3ForCausalLM", {
        **_BASE, "head_dim": 24, "query_pre_attn_scalar": 24, **_WINDOW, "rope_theta": 1e6, "rope_local_base_freq": 100.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }),  # fmt: skip
}
SHARD = "40KB"  # several safetensors files and their index


def write_hf(folder: Path, family: str, dtype: str = "float32", seed: int = 0, **changes) -> Path:
    """``save_pretrained`` of a random tiny model of ``family`` (a key of :data:`FAMILIES`) into ``folder``."""
    import torch
    import transformers

    name, shape = FAMILIES[family]
    torch.manual_seed(seed)
    model_class = getattr(transformers, name)
    config = model_class.config_class(**{**shape, **changes}, torch_dtype=dtype)
    model = model_class(config).to(getattr(torch, dtype))
    with torch.no_grad():  # norms away from their start and biases away from 0, so one read wrong shows
        for path, p in model.named_parameters():
            if path.endswith("norm.weight") or path.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=SHARD)
    return folder


def _model(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()


def hf_logits(folder: Path, tokens: np.ndarray) -> np.ndarray:
    """``transformers``' logits for ``tokens`` [batch, length], float32 (eager attention: every family's)."""
    import torch

    with torch.no_grad():
        return _model(folder)(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def peft_logits(base: Path, adapters: Path, tokens: np.ndarray) -> np.ndarray:
    """The logits of ``base`` with PEFT's ``PeftModel.from_pretrained(model, adapters)``: what a user
    of PEFT gets from jzero's unmerged LoRA export."""
    import torch
    from peft import PeftModel

    with torch.no_grad():
        model = PeftModel.from_pretrained(_model(base), adapters).eval()
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def hf_greedy(folder: Path, prompt: list[int], tokens: int, eos_id: int) -> list[int]:
    """``transformers``' greedy ``generate``: up to ``tokens`` ids after ``prompt``, up to ``eos_id`` (left out)."""
    import torch

    with torch.no_grad():
        out = _model(folder).generate(
            torch.as_tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )  # fmt: skip
    made = out[0, len(prompt) :].tolist()
    return made[: made.index(eos_id)] if eos_id in made else made
