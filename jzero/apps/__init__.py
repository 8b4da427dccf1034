"""What the commands that use a trained or imported run do, above the training layer: sampling from
a run (``jzero sample``), drawing its metrics (``jzero report``) and importing a Hugging Face
checkpoint as a run (``jzero checkpoint import``). The command line (:mod:`jzero.cli`) parses and
calls them; each is a Python API too."""

__all__ = []
