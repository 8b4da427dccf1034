"""The cluster examples in examples/cluster/: their train configs load, their meshes fit the process
and GPU counts the SLURM and Kubernetes files ask for, and JAX's own cluster detection, fed what those
files give one process, finds the job jzero expects. No cluster and no JAX processes: the detection
runs in this one, on faked SLURM variables and a faked Kubernetes API built from the manifest."""

import dataclasses
import math
import os
import re
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml
from jax._src import clusters
from jax._src.clusters import k8s_cluster

import jzero.sharding.mesh
from jzero.config.loading import load_config
from jzero.distributed.launch import fit_problem
from jzero.distributed.runtime import Cluster, find_cluster

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
SBATCH = CLUSTER / "slurm.sbatch"
MANIFEST = CLUSTER / "k8s-indexed-job.yaml"
DETECTION_VARS = ("SLURM_", "OMPI_", "JZERO_", "JAX_COORDINATOR", "JAX_LOCAL_DEVICE_IDS", "KUBERNETES_", "JOB_COMPLETION_INDEX")


# ---------------------------------------------------------------------------------------------
# Reading the example files


def sbatch_options() -> dict[str, str]:
    """``--key`` -> value of the ``#SBATCH`` lines before the first command, as sbatch reads them
    (an unescaped ``#`` after an option starts a comment)."""
    options = {}
    for line in SBATCH.read_text().splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            option = line.removeprefix("#SBATCH ").split("#")[0].strip()
            key, _, value = option.partition("=")
            options[key] = value
    return options


def srun_words() -> list[str]:
    """The words of the script's ``srun`` command, backslash continuations joined."""
    text = SBATCH.read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("srun ")]
    return line.split()


def config_after_train(words: list[str]) -> Path:
    """The config path a ``jzero train CONFIG`` command line names, from the repository root."""
    i = words.index("jzero")
    assert words[i + 1] == "train", words
    return ROOT / words[i + 2]


def manifest() -> dict[str, dict]:
    """The manifest's documents by kind (each kind appears once)."""
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]
    kinds = [d["kind"] for d in docs]
    assert len(set(kinds)) == len(kinds), kinds
    return {d["kind"]: d for d in docs}


def slurm_job() -> tuple[Path, int, int]:
    """The SLURM example's config, process count and GPUs per process."""
    options = sbatch_options()
    nodes, tasks, gpus = (int(options[k]) for k in ("--nodes", "--ntasks-per-node", "--gpus-per-node"))
    assert gpus % tasks == 0, options
    return config_after_train(srun_words()), nodes * tasks, gpus // tasks


def k8s_job() -> tuple[Path, int, int]:
    """The Kubernetes example's config, process count and GPUs per process."""
    job = manifest()["Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    return config_after_train(container["command"]), job["spec"]["parallelism"], gpus


JOBS = {"slurm": slurm_job, "k8s": k8s_job}


# ---------------------------------------------------------------------------------------------
# The configs against the jobs


@pytest.mark.parametrize("name", JOBS)
def test_config_fits_the_job(name):
    path, processes, per_process = JOBS[name]()
    assert path.parent == CLUSTER and path.exists(), path
    config = load_config(path)
    axes, dcn = config.mesh.axes, config.mesh.dcn
    assert dcn, "the example shows mesh.dcn"
    for axis, ways in dcn.items():
        assert axes[axis] % ways == 0, (axis, axes, dcn)
    assert math.prod(dcn.values()) == processes  # what jzero.sharding.mesh.make_mesh requires with several processes
    assert math.prod(axes.values()) == processes * per_process  # every GPU, as jzero launch requires too
    assert fit_problem(config, processes, per_process) is None  # and the global batch splits
    assert config.runtime.distributed == "auto"
    # GPT-2 small, as configs/gpt2-small.yaml has it.
    small = load_config(ROOT / "configs" / "gpt2-small.yaml")
    assert config.model == small.model and config.optimizer == small.optimizer
    assert config.train.global_batch_size == small.train.global_batch_size


def test_k8s_job_counts_agree():
    spec = manifest()["Job"]["spec"]
    assert spec["completionMode"] == "Indexed"
    # JAX reads the process count from spec.parallelism; every index must run at once.
    assert spec["completions"] == spec["parallelism"]


@dataclasses.dataclass(frozen=True)
class FakeGPU:
    """What jax.experimental.mesh_utils reads of a device."""

    id: int
    process_index: int
    host: int
    platform: str = "gpu"
    device_kind: str = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name", JOBS)
def test_each_data_group_is_one_host(name, monkeypatch):
    """jzero.sharding.mesh.make_mesh on the job's devices: each row of ``data`` (a ZeRO group) lies on one
    host and each ``replica`` on another. For SLURM's one task per GPU the host of task r is
    r // ntasks-per-node, which --distribution=block gives."""
    path, processes, per_process = JOBS[name]()
    config = load_config(path)
    per_host = int(sbatch_options()["--gpus-per-node"]) if name == "slurm" else per_process
    if name == "slurm":
        assert "--distribution=block" in srun_words()
    devices = [FakeGPU(i, i // per_process, i // per_host) for i in range(processes * per_process)]
    monkeypatch.setattr(jzero.sharding.mesh, "Mesh", lambda grid, names, axis_types: (grid, names))
    grid, names = jzero.sharding.mesh.make_mesh(config.mesh.axes, devices, config.mesh.dcn)
    hosts = np.vectorize(lambda d: d.host)(grid)
    assert names == ("replica", "data", "model") and hosts.shape == (4, 8, 1)
    assert [sorted(set(row.ravel())) for row in hosts] == [[0], [1], [2], [3]]
    assert sorted(d.id for d in grid.ravel()) == list(range(len(devices)))


# ---------------------------------------------------------------------------------------------
# The Kubernetes manifest against JAX's Kubernetes detection


def api_calls() -> set[tuple[str, str, str]]:
    """(API group, verb, resource) of every Kubernetes API call in jax/_src/clusters/k8s_cluster.py."""
    source = Path(k8s_cluster.__file__).read_text()
    calls = re.findall(r"_(core|batch)_api\.(read|list)_namespaced_(\w+)\(", source)
    groups, verbs = {"core": "", "batch": "batch"}, {"read": "get", "list": "list"}
    return {(groups[g], verbs[v], f"{kind}s") for g, v, kind in calls}


def granted(role: dict, group: str, verb: str, resource: str) -> bool:
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in role["rules"])


def test_manifest_has_what_jax_k8s_detection_needs():
    docs = manifest()
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "Service", "Job"}
    job, service = docs["Job"], docs["Service"]
    pod = job["spec"]["template"]["spec"]
    # A headless Service named as the pods' subdomain, selecting the Job's pods (label job-name).
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert pod["restartPolicy"] == "Never"
    # The pods run as a service account that the Role, through the RoleBinding, lets read what JAX reads.
    account, role, binding = docs["ServiceAccount"], docs["Role"], docs["RoleBinding"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    calls = api_calls()
    assert {("", "list", "pods"), ("batch", "get", "jobs")} <= calls, calls
    assert all(granted(role, *call) for call in calls), calls
    # run.dir is on the volume every pod mounts from one claim.
    config = load_config(k8s_job()[0])
    [container] = pod["containers"]
    claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in claims]
    assert any(Path(config.run.dir).is_relative_to(m) for m in mounts), (config.run.dir, mounts)


@pytest.fixture
def no_cluster(monkeypatch):
    """An environment in which no cluster detection fires until a test sets its variables."""
    for name in list(os.environ):
        if name.startswith(DETECTION_VARS):
            monkeypatch.delenv(name)


def detected_by_jax(timeout_s: int) -> tuple:
    """What jax.distributed.initialize() would find by itself."""
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, timeout_s)


class FakeKubernetes:
    """The parts of the `kubernetes` package that k8s_cluster.py uses, answering from the manifest
    as the API server would for the pod of one index; records each call as (group, verb, resource)."""

    def __init__(self, docs: dict[str, dict], index: int, ips: dict[str, str]):
        job, template = docs["Job"], docs["Job"]["spec"]["template"]
        name = job["metadata"]["name"]
        labels = {**template.get("metadata", {}).get("labels", {}), "job-name": name, "batch.kubernetes.io/job-name": name}
        owner = types.SimpleNamespace(controller=True, kind="Job", name=name)
        self.pod = types.SimpleNamespace(
            metadata=types.SimpleNamespace(name=f"{name}-{index}-x7k2p", labels=labels, owner_references=[owner]),
            spec=types.SimpleNamespace(subdomain=template["spec"].get("subdomain")),
        )
        self.job = types.SimpleNamespace(
            metadata=types.SimpleNamespace(name=name, labels=dict(labels)),
            spec=types.SimpleNamespace(parallelism=job["spec"]["parallelism"], completions=job["spec"]["completions"]),
        )
        service = docs["Service"]
        self.services = [
            types.SimpleNamespace(
                metadata=types.SimpleNamespace(name=service["metadata"]["name"]),
                spec=types.SimpleNamespace(cluster_ip=service["spec"]["clusterIP"], selector=service["spec"]["selector"]),
            )
        ]
        self.pod_ip = ips[f"{name}-{index}"]
        self.calls: list[tuple[str, str, str]] = []
        self.module = types.ModuleType("kubernetes")
        self.module.config = types.SimpleNamespace(load_incluster_config=lambda: None)
        self.module.client = types.SimpleNamespace(
            CoreV1Api=lambda: self, BatchV1Api=lambda: self, exceptions=types.SimpleNamespace(ApiException=LookupError)
        )

    def list_namespaced_pod(self, namespace, field_selector):
        self.calls.append(("", "list", "pods"))
        hit = field_selector == f"status.podIP={self.pod_ip}"
        return types.SimpleNamespace(items=[self.pod] if hit else [])

    def read_namespaced_job(self, name, namespace):
        self.calls.append(("batch", "get", "jobs"))
        assert name == self.job.metadata.name
        return self.job

    def list_namespaced_service(self, namespace):
        self.calls.append(("", "list", "services"))
        return types.SimpleNamespace(items=self.services)


@pytest.fixture
def fresh_k8s_detection():
    """k8s_cluster.py caches the pod, the Job and the Service per process; each test starts afresh."""
    cached = ("_pod", "_job", "_headless_svc", "_controller")

    def clear():
        for name in cached:
            vars(k8s_cluster.K8sCluster)[name].__func__.cache_clear()

    clear()
    yield
    clear()


def fake_k8s_pod(monkeypatch, docs, index) -> FakeKubernetes:
    """Be the pod of ``index``: its variables, DNS as the headless Service gives it, the fake API."""
    name, subdomain = docs["Job"]["metadata"]["name"], docs["Job"]["spec"]["template"]["spec"].get("subdomain")
    ips = {f"{name}-{i}": f"10.8.0.{10 + i}" for i in range(docs["Job"]["spec"]["parallelism"])}
    ips |= {f"{host}.{subdomain}": ip for host, ip in ips.items()} if subdomain else {}
    api = FakeKubernetes(docs, index, ips)
    monkeypatch.setitem(sys.modules, "kubernetes", api.module)
    monkeypatch.setattr(k8s_cluster.K8sCluster, "_namespace", classmethod(lambda cls: "jzero"))

    def resolve(host):
        if host not in ips:
            raise socket.gaierror(f"unknown host {host}")
        return ips[host]

    monkeypatch.setattr(socket, "gethostbyname", resolve)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", f"{name}-{index}")  # an indexed Job's pod hostname
    monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
    return api


def test_k8s_detection_finds_the_indexed_job(monkeypatch, no_cluster, fresh_k8s_detection):
    docs = manifest()
    api = fake_k8s_pod(monkeypatch, docs, index=2)
    runtime = load_config(k8s_job()[0]).runtime
    cluster = find_cluster(runtime)
    job = docs["Job"]
    coordinator = f"{job['metadata']['name']}-0.{job['spec']['template']['spec']['subdomain']}:55527"
    assert cluster is not None and cluster.coordinator == coordinator
    assert (cluster.num_processes, cluster.process_id, cluster.local_device_ids) == (job["spec"]["parallelism"], 2, None)
    assert detected_by_jax(runtime.initialization_timeout_s) == (coordinator, job["spec"]["parallelism"], 2, None)
    # Every call the detection made is one the Role grants.
    assert api.calls and all(granted(docs["Role"], *call) for call in api.calls), api.calls


def test_k8s_detection_without_the_subdomain_names_the_service(monkeypatch, no_cluster, fresh_k8s_detection):
    """Why the Role may list services: JAX's message for a missing subdomain names the headless
    Service that selects the pod."""
    docs = manifest()
    del docs["Job"]["spec"]["template"]["spec"]["subdomain"]
    api = fake_k8s_pod(monkeypatch, docs, index=0)
    with pytest.raises(RuntimeError, match=f"A headless service '{docs['Service']['metadata']['name']}' is found"):
        find_cluster(load_config(k8s_job()[0]).runtime)
    assert ("", "list", "services") in api.calls and all(granted(docs["Role"], *call) for call in api.calls)


# ---------------------------------------------------------------------------------------------
# The SLURM script against JAX's SLURM detection


def slurm_task(monkeypatch, proc_id: int, local_id: int, ntasks: int, job_id: int = 4242) -> None:
    """The variables srun gives one task of the job (those slurm_cluster.py reads)."""
    monkeypatch.setenv("SLURM_JOB_ID", str(job_id))
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[017-020]")
    monkeypatch.setenv("SLURM_NTASKS", str(ntasks))
    monkeypatch.setenv("SLURM_PROCID", str(proc_id))
    monkeypatch.setenv("SLURM_LOCALID", str(local_id))


@pytest.mark.parametrize("port", [None, "12345"])
def test_slurm_detection_finds_the_sbatch_job(monkeypatch, no_cluster, port):
    path, processes, _ = slurm_job()
    per_node = int(sbatch_options()["--ntasks-per-node"])
    task = 13  # the sixth GPU of the second node, under --distribution=block
    slurm_task(monkeypatch, task, task % per_node, processes)
    if port:
        monkeypatch.setenv("JAX_COORDINATOR_PORT", port)
    runtime = load_config(path).runtime
    # The first node of the step, on JAX_COORDINATOR_PORT or a port from the job id: 61440 + 4242 % 4096.
    coordinator = f"gpu017:{port or 61586}"
    want = Cluster(coordinator, processes, task, (task % per_node,), source="SlurmCluster")
    assert find_cluster(runtime) == want
    assert detected_by_jax(runtime.initialization_timeout_s) == (coordinator, processes, task, [task % per_node])


def test_one_slurm_task_per_node_would_see_one_gpu(monkeypatch, no_cluster):
    """Why the example runs one task per GPU: with one task per node SLURM_LOCALID is 0 on every
    node, and JAX's detection restricts each process to GPU 0."""
    slurm_task(monkeypatch, proc_id=1, local_id=0, ntasks=4)
    cluster = find_cluster(load_config(slurm_job()[0]).runtime)
    assert cluster is not None and (cluster.num_processes, cluster.process_id) == (4, 1)
    assert cluster.local_device_ids == (0,)
    # The README's way round it: JAX_LOCAL_DEVICE_IDS, which auto then leaves to jax.distributed.initialize.
    monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0,1,2,3,4,5,6,7")
    cluster = find_cluster(load_config(k8s_job()[0]).runtime)
    assert cluster == Cluster("gpu017:61586", 4, 1, None, source="SlurmCluster")


def test_no_cluster_is_one_process(no_cluster):
    assert find_cluster(load_config(slurm_job()[0]).runtime) is None
