"""The suite's XLA flags, read by ``tests/conftest.py`` before JAX starts (so nothing is imported here).

LLVM optimisation level 0 cuts compile time by about a third on these tiny models, and one LLVM
module per program instead of several compiled in parallel takes a fifth less CPU on 2 busy cores
(the tiny GPT's step: 0.59 -> 0.46 CPU-s, ``python benchmarks/cpu_compile.py [FLAG]``); the HLO (its
sharding, collectives and memory analysis) is what the tests check, and neither changes it.

XLA's CPU fusion emitters are most of a compile's time here (the tiny GPT's one-device step: 2.16 s
with them, 0.50 s without, docs/design.md), and a program compiled without them is another program:
its fusions, and so what is live at once, differ (`jzero plan configs/gpt-tiny.yaml` gathers 1.33
layers' worth at once without them, 1.00 with). The suite compiles without them. A test that reads
the structure of the program users get compiles with them: a job's config takes
:data:`USERS_EMITTERS`, and a process of its own takes :func:`users_emitters_env`.
"""

import os

LLVM_FAST = "--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1"  # O0, one module
DEVICES = "--xla_force_host_platform_device_count=8"
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"
ON = "JZERO_SUITE_FUSION_EMITTERS"  # "on" in a process's environment: it compiles as users do
USERS_EMITTERS = "compiler.xla_options.xla_cpu_use_fusion_emitters=true"  # one job's compiles, as users'


def compile_flags() -> str:
    """The suite's compile flags without its device count: LLVM's, and the fast compile unless
    :data:`ON` says otherwise. For a process that simulates the devices its config asks for."""
    return LLVM_FAST if os.environ.get(ON) == "on" else f"{LLVM_FAST} {FAST_COMPILE}"


def suite_flags() -> str:
    """This process's flags: the suite's 8 devices and :func:`compile_flags`."""
    return f"{DEVICES} {compile_flags()}"


def own_devices_env() -> dict[str, str]:
    """The environment for a ``jzero`` subprocess that simulates the devices its config asks for
    (``runtime.cpu_devices``), not the suite's 8, and compiles at the suite's speed."""
    return {**os.environ, "XLA_FLAGS": compile_flags()}


def users_emitters_env() -> dict[str, str]:
    """The environment for a subprocess that runs the suite's setup but compiles as users do."""
    inherited = [f for f in os.environ.get("XLA_FLAGS", "").split() if f != FAST_COMPILE]
    return {**os.environ, "XLA_FLAGS": " ".join(inherited), ON: "on"}
