"""One home for what jzero asks of XLA: its flags and options (:mod:`jzero.compiler.xla_flags`),
the persistent compilation cache (:mod:`jzero.compiler.cache`), and which platforms this host can
compile for (:mod:`jzero.compiler.platforms`)."""

__all__ = []
