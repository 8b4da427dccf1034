"""``python -m jzero.cli``: the ``jzero`` command."""

import sys

from jzero.cli.main import main

__all__ = []

sys.exit(main())
