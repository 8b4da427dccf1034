"""The ``jzero`` command line: its parser and its commands. Nothing in the package imports it."""

__all__ = []
