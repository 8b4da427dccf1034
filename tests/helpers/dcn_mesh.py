"""One process of a two-process run: build a `replica x data` mesh with `dcn: {replica: 2}`, train
two ZeRO-3 steps on it, save an Orbax checkpoint (each process writes its own shards) and take a
third step. Run by tests/test_multiprocess.py as
``python dcn_mesh.py PORT PROCESS_ID OUT_JSON RUN_DIR``."""

import json
import sys

import jax

port, process_id, out, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)

from jzero.build import setup  # noqa: E402
from jzero.checkpoint import RunCheckpoints  # noqa: E402
from jzero.config import load_config  # noqa: E402
from jzero.data import text_batches  # noqa: E402

cfg = load_config(
    None,
    [
        "mesh.axes={replica: 2, data: 4}",
        "mesh.dcn={replica: 2}",
        "zero.stage=3",
        "model.d_model=32",
        "model.n_layers=2",
        "model.n_heads=2",
        "model.seq_len=16",
        "train.global_batch_size=16",
        "data.max_bytes=100000",
    ],
)
s = setup(cfg)
data = text_batches(None, cfg.data.max_bytes, cfg.model.seq_len, cfg.train.global_batch_size, cfg.seed)
state = s.init_state()
step = s.make_step()
losses = []
for k in range(3):
    if k == 2:
        checkpoints = RunCheckpoints(run_dir)
        checkpoints.save(2, state, data.state(2), {})
        checkpoints.close()
    state, metrics = step(state, data.device_batch(k, s.plan.batch))
    losses.append(float(metrics["loss"]))
grid = [[d.process_index for d in row.flat] for row in s.mesh.devices]
with open(out, "w") as f:
    json.dump({"grid_processes": grid, "losses": losses, "devices": jax.device_count()}, f)
jax.distributed.shutdown()
