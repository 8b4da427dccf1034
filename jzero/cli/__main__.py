"""``python -m jzero.cli``: the ``jzero`` command."""

import sys

from jzero.cli.program import run

__all__ = []

sys.exit(run())
