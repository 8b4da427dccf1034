"""Moved: jzero's Llama is the ``llama`` row of the one decoder, :mod:`jzero.models.decoder`
(``Decoder(arch="llama", ...)``, the default row). The old names answer with a warning."""

from jzero.lazy import moved_names

__all__ = []

__getattr__ = moved_names(__name__, {
    "Llama": "jzero.models.decoder.Decoder",
    "LlamaBlock": "jzero.models.decoder.DecoderBlock",
    "RMSNorm": "jzero.models.decoder.RMSNorm",
    "rope_scaling_pairs": "jzero.models.decoder.rope_scaling_pairs",
    "MLP_ACT": "jzero.models.decoder.MLP_ACT",
})  # fmt: skip
