"""What is sharded: the mesh and its axes (:mod:`jzero.sharding.mesh`, :mod:`jzero.sharding.axes`),
what each ZeRO stage partitions (:mod:`jzero.sharding.stages`), the plan of every leaf's
sharding (:mod:`jzero.sharding.plan`), and the train state made on it
(:mod:`jzero.sharding.state`, :mod:`jzero.sharding.placement`)."""

__all__ = []
