"""How the shards are communicated: ZeRO-3's gathers by layer or gathering unit
(:mod:`jzero.communication.gather`, :mod:`jzero.communication.units`), the collectives under
``shard_map`` (:mod:`jzero.communication.collectives`) and ZeRO++'s block quantization
(:mod:`jzero.communication.quantize`)."""

__all__ = []
