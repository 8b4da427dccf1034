"""One process per host under ``jax.distributed``, JAX's own multi-controller runtime.

:func:`initialize` runs before anything starts JAX's backends. It finds the cluster
(:func:`find_cluster`: ``runtime.distributed``, ``jzero launch``'s variables, or JAX's own detection
of SLURM, Open MPI, Kubernetes...), checks that the coordinator answers, and calls
``jax.distributed.initialize`` with the config's timeouts. XLA's collectives then span the processes:
NCCL on GPUs, gloo on CPUs.

A dead peer must not leave the others hanging in a collective. JAX's coordinator notices a process
that stops sending heartbeats; :class:`Watchdog` asks it which processes are alive and, when one is
lost, ends this process at once with a line naming it (exit status :data:`jzero.distributed.process.LOST_PEER`). The
runtime runs in JAX's recoverable mode, so that this line, not a native crash, is how a survivor
ends; the price is that the processes must leave in order (:func:`finish`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from pathlib import Path

from jzero.config.run_folder import RunLock, check_run_path
from jzero.config.schema import ClusterConfig, RuntimeConfig, check_coordinator
from jzero.distributed.process import LOST_PEER, exit_now
from jzero.errors import ConfigError, OutputWriteError

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "Cluster",
    "Watchdog",
    "find_cluster",
    "finish",
    "initialize",
    "is_primary",
    "lock_run_dir",
]

# What `jzero launch` sets for each process it starts; `runtime.distributed: auto` reads them first.
ENV_COORDINATOR = "JZERO_COORDINATOR"
ENV_NUM_PROCESSES = "JZERO_NUM_PROCESSES"
ENV_PROCESS_ID = "JZERO_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A multi-process job as this process sees it."""

    coordinator: str  # HOST:PORT, served by process 0
    num_processes: int
    process_id: int
    local_device_ids: tuple[int, ...] | None = None  # e.g. SLURM's one GPU per task
    source: str = "runtime.distributed"  # where it was found, for messages


def _from_launch_env() -> Cluster | None:
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    if not any(n in os.environ for n in names):
        return None
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise ConfigError(missing[0], f"is unset while {', '.join(n for n in names if n in os.environ)} is set")
    try:
        count, index = int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID])
    except ValueError:
        raise ConfigError(ENV_NUM_PROCESSES, f"and {ENV_PROCESS_ID} must be integers") from None
    ClusterConfig(os.environ[ENV_COORDINATOR], count, index).check(keys=names)
    return Cluster(os.environ[ENV_COORDINATOR], count, index, source="jzero launch")


def _from_jax_detection(timeout_s: int) -> Cluster | None:
    """JAX's own cluster detection (SLURM, Open MPI, Kubernetes, Cloud TPU, ...), or None."""
    from jax._src import clusters  # the detection jax.distributed.initialize() runs itself

    address, count, index, local = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        os.environ.get("JAX_COORDINATOR_ADDRESS"), None, None, None, None, timeout_s
    )
    if address is None or count is None or index is None:
        return None
    # The detector JAX chose, picked as JAX picks it (opt-in detectors only when asked for).
    found = (e for e in clusters.ClusterEnv._cluster_types if not e.opt_in_only_method and e.is_env_present())
    env = next((e.__name__ for e in found), "the environment")
    if os.environ.get("JAX_LOCAL_DEVICE_IDS"):
        local = None  # the user's choice of devices, which jax.distributed.initialize reads itself
    return Cluster(address, int(count), int(index), tuple(local) if local else None, source=env)


def find_cluster(runtime: RuntimeConfig) -> Cluster | None:
    """The multi-process job this process belongs to, or None to run as one process.

    ``runtime.distributed`` decides: ``off`` is one process; a mapping is that job; ``auto`` takes
    ``jzero launch``'s variables, else JAX's cluster detection, else one process. A job of one
    process is one process.
    """
    mode = runtime.distributed
    if mode == "off":
        return None
    if isinstance(mode, ClusterConfig):
        cluster = Cluster(mode.coordinator, mode.num_processes, mode.process_id)
    else:
        cluster = _from_launch_env() or _from_jax_detection(runtime.initialization_timeout_s)
    return cluster if cluster is not None and cluster.num_processes > 1 else None


def wait_for_coordinator(cluster: Cluster, timeout_s: float, key: str = "runtime.distributed.coordinator") -> None:
    """Process 0 checks that it can serve the coordinator's port; the others that it answers within
    ``timeout_s``. JAX would abort the process (a native crash) instead of raising."""
    host, port = check_coordinator(cluster.coordinator, key)
    if cluster.process_id == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError as err:
                raise ConfigError(key, f"process 0 cannot serve port {port}: {err.strerror or err}") from None
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    key,
                    f"{cluster.coordinator} ({cluster.source}) did not answer within "
                    f"runtime.initialization_timeout_s={timeout_s:g}s: {err.strerror or err}",
                ) from None
            time.sleep(0.2)


def initialize(runtime: RuntimeConfig) -> Cluster | None:
    """Join the multi-process job :func:`find_cluster` finds, before JAX's backends start.

    On CPUs the collectives use gloo. Returns the cluster, or None for one process.

    Raises:
      ConfigError: the cluster's settings are wrong, or its coordinator does not answer in time.
    """
    import jax

    cluster = find_cluster(runtime)
    if cluster is None or jax.distributed.is_initialized():
        return cluster
    where = {"jzero launch": ENV_COORDINATOR, "runtime.distributed": "runtime.distributed.coordinator"}
    wait_for_coordinator(cluster, runtime.initialization_timeout_s, where.get(cluster.source, "runtime.distributed"))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)  # survivors end through the Watchdog
    jax.distributed.initialize(
        cluster.coordinator,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
        local_device_ids=list(cluster.local_device_ids) if cluster.local_device_ids else None,
        initialization_timeout=runtime.initialization_timeout_s,
        heartbeat_timeout_seconds=runtime.heartbeat_timeout_s,
        shutdown_timeout_seconds=runtime.shutdown_timeout_s,
    )
    return cluster


def is_primary() -> bool:
    """Whether this is process 0, the one that writes the run's outputs and prints."""
    import jax

    return jax.process_index() == 0


def lock_run_dir(path: str) -> RunLock:
    """The run folder's lock (:class:`~jzero.config.run_folder.RunLock`), held by process 0 once every
    process knows it got it; every process raises the refusal. Release it on every exit path.

    Raises:
      ConfigError: ``run.dir``: another trainer holds the folder, or it cannot be made.
    """
    from jzero.checkpoint.verify import on_every_process  # JAX: not at this module's import

    run_dir = Path(path)
    check_run_path(run_dir)
    lock, refused = RunLock(run_dir), None
    if is_primary():
        try:
            lock.acquire()
        except (ConfigError, OutputWriteError) as err:
            refused = err
    # The others learn process 0's answer (a collective when there are several).
    if any(on_every_process(refused is not None)) and refused is None:
        refused = ConfigError("run.dir", f"process 0 could not take the lock {lock.folder.lock}")
    if refused is not None:
        raise refused
    return lock


def _client():  # JAX's own client of its coordination service
    from jax._src.distributed import global_state

    return global_state.client


class Watchdog:
    """Ends this process when a peer is lost, instead of leaving it in a collective that never ends.

    Its thread asks JAX's coordinator, over and over, which processes are alive
    (``get_live_nodes``). That call is itself a collective: it returns once every live process has
    made it, and the coordinator declares a process dead after ``runtime.heartbeat_timeout_s``
    without a heartbeat. A process missing from the answer that did not say it was leaving
    (:func:`finish`) is lost: this process ends at once with one line naming it, exit status
    :data:`jzero.distributed.process.LOST_PEER`. Nothing half-written is committed (Orbax renames a checkpoint only
    when it is complete). A lost process 0 takes the coordinator with it; JAX itself then ends the
    others, naming "the leader task".

    Only this thread calls ``get_live_nodes`` while it runs (two calls from one process would
    meet each other's round), and :meth:`stop` never waits for it: its call may be waiting for a
    peer that has stopped watching too.
    """

    def __init__(self, interval_s: float = 1.0):
        import jax

        self.processes = list(range(jax.process_count()))
        self.me = jax.process_index()
        self.interval_s = interval_s
        self.alone = threading.Event()  # every other process has left, each having said so
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jzero-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        if len(self.processes) > 1:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def watching(self) -> bool:
        """Whether its thread is still running (it ends after :meth:`stop`, or never started)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop acting on what the coordinator says (the thread ends after its call in flight)."""
        self._stop.set()

    def _run(self) -> None:
        client = _client()
        while not self._stop.is_set():
            try:
                alive = client.get_live_nodes(self.processes)
            except Exception as err:  # the coordinator itself is gone
                if self._stop.is_set() or _has_left(client, 0):
                    return
                exit_now(f"the coordinator (process 0) stopped answering: {str(err).splitlines()[0][:160]}", LOST_PEER)
            if self._stop.is_set():
                return
            missing = [p for p in self.processes if p not in alive]
            lost = [p for p in missing if not _has_left(client, p)]
            if lost:
                names = ", ".join(map(str, lost))
                exit_now(f"lost process {names} (no heartbeat for runtime.heartbeat_timeout_s); "
                         f"process {self.me} stops without finishing the run", LOST_PEER)  # fmt: skip
            if len(missing) == len(self.processes) - 1:
                self.alone.set()
            self._stop.wait(self.interval_s)


def _left_key(process: int) -> str:
    return f"jzero/left/{process}"


def _has_left(client, process: int) -> bool:
    """Whether ``process`` said, in JAX's key-value store, that it is leaving on purpose."""
    try:
        return client.key_value_try_get(_left_key(process)) == "1"
    except Exception:  # not found
        return False


def finish(timeout_s: float, watchdog: Watchdog | None = None) -> None:
    """Leave the job in order: all meet at a barrier, each says it is leaving, the others
    disconnect, and process 0 (which serves the coordinator) leaves last. In recoverable mode
    nothing else orders them, and a process whose coordinator vanished before it disconnected
    would crash. With a running ``watchdog``, process 0 learns from it that the others are gone."""
    import jax

    if not jax.distributed.is_initialized():
        return
    client = _client()
    me = jax.process_index()
    client.wait_at_barrier("jzero-finish", int(timeout_s * 1000))
    # After the barrier: a process that fails alone never says it is leaving, and stays "lost".
    client.key_value_set(_left_key(me), "1")
    if me == 0 and watchdog is not None and watchdog.watching:
        watchdog.alone.wait(timeout_s)
    elif me == 0:
        everyone = list(range(jax.process_count()))
        deadline = time.monotonic() + timeout_s
        while len(client.get_live_nodes(everyone)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    if watchdog is not None:
        watchdog.stop()
    jax.distributed.shutdown()
