"""The CPU code path the tests run on.

`make test` runs the tests marked `numeric` a second time with ATEN_CPU_CAPABILITY=avx2 (see the
Makefile): PyTorch's AVX2 kernels instead of the widest this CPU has. That second run is only
worth something if PyTorch honours the variable, so it is checked here rather than assumed.

`make test` runs the tests in one process per core (pytest-xdist, `-n`): each of those workers,
and every command a test starts from it, keeps to one thread. N workers of N threads each on N
cores oversubscribe them: on two cores (AMD EPYC Zen 3) the suite took 12:21 that way, against
12:17 in one process and 7:10 with one thread a worker. The numeric tests' second run, in one
process, keeps every core's thread.

Tests marked `bf16` train or decode in bf16 through aiayn, which refuses bf16 on a CPU without
hardware bf16 (an AVX2-only AMD EPYC, Zen 3): there they are skipped, and the refusal itself is
tested (tests/test_faults.py).
"""

import os
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"  # for the commands the tests start
    torch.set_num_threads(1)


def _cpu_flags() -> set:
    """The CPU's feature flags on Linux, an empty set elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def pytest_configure(config):
    requested = os.environ.get("ATEN_CPU_CAPABILITY", "")
    actual = torch.backends.cpu.get_cpu_capability()
    # ATen takes its AVX2 kernels when the CPU has AVX2 and FMA; anything else means the variable
    # was ignored (torch reads only lower-case names) and the "second" run would repeat the first.
    if requested.lower() == "avx2" and {"avx2", "fma"} <= _cpu_flags() and actual != "AVX2":
        raise pytest.UsageError(f"ATEN_CPU_CAPABILITY={requested} is set but torch runs its {actual} kernels")


def pytest_collection_modifyitems(config, items):
    from aiayn.device import fast_bf16

    if fast_bf16(torch.device("cpu")):
        return
    skip = pytest.mark.skip(reason=f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no hardware bf16: "
                                   "aiayn refuses bf16 here")
    for item in items:
        if item.get_closest_marker("bf16"):
            item.add_marker(skip)


def pytest_report_header(config):
    requested = os.environ.get("ATEN_CPU_CAPABILITY")
    line = f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}"
    return line + (f" (ATEN_CPU_CAPABILITY={requested})" if requested else "")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The tiny run of tests/fixtures (a model trained 12 steps on a toy corpus, with its
    tokenizer and averaged/), unpacked once, for tests that only read it."""
    import tarfile

    folder = tmp_path_factory.mktemp("tiny")
    with tarfile.open(Path(__file__).parent / "fixtures" / "run-c08bdea.tar.xz") as archive:
        archive.extractall(folder, filter="data")
    return folder / "run"
