"""One process of a checkpoint round trip across process counts, run by tests/distributed/test_launch.py.

``python state_digest.py save RUN_DIR STEPS OUT.npz [KEY=VALUE ...]`` trains STEPS steps, saves
the state at that step and writes the live state, gathered whole, to OUT.npz (process 0).
``python state_digest.py restore RUN_DIR:STEP:OUT.npz [...] -- [KEY=VALUE ...]`` restores each
checkpoint onto this job's mesh and writes what it restored the same way. Beside each OUT.npz,
OUT.json holds which process owns each device of the mesh, row by row along its first axis.

The job is the one ``runtime.distributed: auto`` finds: the test sets jzero launch's variables.
"""

import json
import sys
from pathlib import Path

from jzero.config.loading import load_config
from jzero.distributed.process import import_jax, start_backends
from jzero.distributed.runtime import finish, initialize
from jzero.sharding.mesh import simulate_cpu_devices

mode, rest = sys.argv[1], sys.argv[2:]
if mode == "save":
    run_dir, steps, out, *overrides = rest
    jobs = [(run_dir, int(steps), out)]
else:
    split = rest.index("--")
    jobs = [(p, int(k), o) for p, k, o in (item.split(":") for item in rest[:split])]
    overrides = rest[split + 1 :]

import_jax()
config = load_config(None, overrides)
simulate_cpu_devices(config.runtime.cpu_devices)
initialize(config.runtime)
start_backends()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from jzero.checkpoint.runs import RunCheckpoints  # noqa: E402
from jzero.training.data import text_batches  # noqa: E402
from jzero.training.job import build_job  # noqa: E402

s = build_job(config)
for run_dir, steps, out in jobs:
    checkpoints = RunCheckpoints(run_dir)
    if mode == "save":
        m, t = config.model, config.train
        data = text_batches(None, config.data.max_bytes, m.seq_len, t.global_batch_size, config.seed)
        state, step = s.init_state(), s.make_step()
        for k in range(steps):
            state, _ = step(state, data.device_batch(k, s.plan.batch))
        checkpoints.save(steps, state, data.state(steps), {})
    else:
        state = checkpoints.restore(steps, s.abstract_state()).state
    checkpoints.close()
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    whole = {jax.tree_util.keystr(path): np.asarray(multihost_utils.process_allgather(leaf, tiled=True)) for path, leaf in flat}
    if jax.process_index() == 0:
        np.savez(out, **whole)
        grid = [[d.process_index for d in row.flat] for row in s.mesh.devices.reshape(s.mesh.devices.shape[0], -1)]
        Path(out).with_suffix(".json").write_text(json.dumps({"grid_processes": grid}))
finish(60)
