"""What a compiled program's HLO shows, one public name per reading: its collectives
(:mod:`jzero.ledger.collectives`), its memory (:mod:`jzero.ledger.memory`), what its layer loops
save (:mod:`jzero.ledger.saved`) and its loops' trip counts (:mod:`jzero.ledger.hlo_text`, the
parser they share)."""

from jzero.ledger.collectives import (
    COLLECTIVES,
    Collective,
    communication_by_dtype,
    communication_bytes,
    group_size,
    paper_bytes,
    parse_collectives,
    summarize_collectives,
)
from jzero.ledger.hlo_text import trip_count
from jzero.ledger.memory import compiled_memory, flops_per_device, host_entry_bytes, live_bytes_per_device, live_bytes_per_process
from jzero.ledger.saved import forward_loop, forward_loop_writes, saved_activations

__all__ = [
    "COLLECTIVES",
    "Collective",
    "communication_by_dtype",
    "communication_bytes",
    "compiled_memory",
    "flops_per_device",
    "forward_loop",
    "forward_loop_writes",
    "group_size",
    "host_entry_bytes",
    "live_bytes_per_device",
    "live_bytes_per_process",
    "paper_bytes",
    "parse_collectives",
    "saved_activations",
    "summarize_collectives",
    "trip_count",
]
