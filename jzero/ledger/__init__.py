"""The ledger's instruments: reading compiled HLO (collectives, memory, what is gathered at once),
the paper's estimate, GPU targets compiled on a CPU host, and rendering reports as text.

The diagnostics most used from Python load on first use from here, e.g.
``jzero.ledger.parse_collectives(compiled.as_text())``.
"""

from typing import TYPE_CHECKING

from jzero.lazy import lazy_names

_HLO = ("compiled_memory", "live_bytes_per_device", "parse_collectives")
_API = {name: "jzero.ledger.hlo" for name in _HLO}
_API |= {name: "jzero.ledger.gathered" for name in ("gathered_at_once", "gathered_peak")}
_API |= {"parse_target": "jzero.ledger.targets"}
if TYPE_CHECKING:  # the table above, for type checkers and IDEs (tests/test_api.py keeps the two equal)
    from jzero.ledger.gathered import gathered_at_once, gathered_peak
    from jzero.ledger.hlo import compiled_memory, live_bytes_per_device, parse_collectives
    from jzero.ledger.targets import parse_target
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_names(__name__, _API)
