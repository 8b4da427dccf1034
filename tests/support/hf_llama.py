"""A tiny Llama written by ``transformers`` itself, and its logits: what the import is held to."""

from pathlib import Path

import numpy as np

# Llama 3.1's choices at a tiny size: grouped-query attention (4 query heads, 2 key/value heads),
# untied embeddings, an MLP of its own width, rope_theta and Llama 3's rope_scaling (its original
# context short enough that the scaling changes most frequencies here).
SHAPE = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}  # fmt: skip
SHARD = "40KB"  # several safetensors files and their index (the model's weights are about 190 KB in float32)


def write_hf_llama(folder: Path, dtype: str = "float32", seed: int = 0, **changes) -> Path:
    """``LlamaForCausalLM.save_pretrained`` of a random tiny Llama into ``folder`` (sharded safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**SHAPE, **changes}, torch_dtype=dtype)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    with torch.no_grad():  # norms away from 1, so a scale read wrong shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=SHARD)
    return folder


def hf_logits(folder: Path, tokens: np.ndarray) -> np.ndarray:
    """``transformers``' logits for ``tokens`` [batch, length], float32."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def write_tokenizer(folder: Path, vocab_size: int) -> int:
    """A byte-level BPE of ``vocab_size`` ids (:func:`jzero.data.tokenizer.train_bpe` on a few of the
    standard library's sources) as the folder's ``tokenizer.json``; its end-of-document id."""
    import sysconfig

    from jzero.data.tokenizer import EOS, train_bpe

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text() for name in ("textwrap.py", "string.py", "shlex.py")]
    hf = train_bpe(texts, vocab_size)
    hf.save(str(folder / "tokenizer.json"))
    return hf.token_to_id(EOS)


def hf_greedy(folder: Path, prompt: list[int], tokens: int, eos_id: int) -> list[int]:
    """``transformers``' greedy ``generate``: up to ``tokens`` ids after ``prompt``, up to ``eos_id`` (left out)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.as_tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=eos_id,
                             pad_token_id=eos_id, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))  # fmt: skip
    made = out[0, len(prompt) :].tolist()
    return made[: made.index(eos_id)] if eos_id in made else made
