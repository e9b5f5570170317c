"""Devices and numeric precision: one place that decides where and in what format we compute."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import re
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from aiayn.errors import environment_count

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; anything else must exist here."""
    if isinstance(name, bool) or not isinstance(name, (str, torch.device, int)):  # (found by a misuse hunt: None
        # and a DecodeConfig were torch.device's TypeError of many lines)
        raise TypeError(f"device takes a name (auto, cpu, cuda or cuda:N) or a torch.device, not a {type(name).__name__}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this machine has no CUDA GPU")
    if device.type not in ("cpu", "cuda"):  # mps, xpu, meta ...: names PyTorch knows, aiayn does not run on
        raise ValueError(f"aiayn runs on a CPU or a CUDA GPU, not on {name!r}; use auto, cpu, cuda or cuda:N")
    # One CPU: PyTorch takes cpu:0 for it, safetensors did not (found in review: translate named
    # the weights' file as the fault, where train had run on it).
    return torch.device("cpu") if device.type == "cpu" else device


@functools.lru_cache(maxsize=None)
def fast_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products in hardware: a GPU with bf16, or a CPU that
    oneDNN's bf16 kernels run on (AVX-512 or AMX). On any other CPU (an AVX2-only AMD EPYC Zen 3,
    say) PyTorch computes bf16 products in a generic loop, many times slower than fp32. Asked
    once per device: `autocast` checks the precision at every training step."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto': bf16 where `device` computes it in hardware (`fast_bf16`), else fp32; any other
    precision is itself."""
    if precision != "auto":
        return precision
    return "bf16" if fast_bf16(device) else "fp32"


def check_precision(device: torch.device, precision: str, tf32: bool = False) -> None:
    """fp16 only on a CUDA GPU: it needs loss scaling, and CPUs lack fast fp16. int8 (decoding
    only) only on a CPU: its kernels are FBGEMM's and oneDNN's. bf16 only where it is computed in
    hardware (`fast_bf16`): elsewhere it would be a silent slowdown, never a speed-up. `tf32`
    (fp32 training with TF32 products, `allow_tf32`) only on a CUDA GPU."""
    if tf32 and device.type != "cuda":
        raise ValueError("tf32 is a CUDA GPU's format (Ampere and newer); a CPU computes fp32 products in fp32")
    if precision == "fp16" and device.type != "cuda":
        instead = "bf16 or fp32" if fast_bf16(device) else "fp32 (this CPU has no hardware bf16)"
        raise ValueError(f"fp16 needs a CUDA GPU (a CPU has no fast fp16); on this CPU use {instead}")  # not "loss scaling" to a decoder (found in review)
    if precision == "int8" and device.type != "cpu":
        raise ValueError("int8 decoding runs on a CPU; use bf16 or fp16 on a GPU")
    if precision == "bf16" and not fast_bf16(device):
        where = f"this CPU ({cpu_kind()}, {torch.backends.cpu.get_cpu_capability()})" if device.type == "cpu" else "this GPU"
        raise ValueError(f"bf16 needs hardware bf16 (a CPU with AVX-512 or AMX, a GPU with bf16); {where} would emulate "
                         "it many times slower than fp32: use fp32 (or int8 to decode on a CPU)")


def allow_tf32(device: torch.device) -> None:
    """fp32 matrix products on `device`, a CUDA GPU, in TF32: inputs rounded to a 10-bit
    mantissa, products summed in fp32, on the tensor cores: several times the IEEE fp32 rate.
    PyTorch computes IEEE fp32 unless told; most fp32 training on GPUs runs like this (the TF32
    rows of the README's GPU figures). A GPU older than Ampere computes fp32 as before."""
    check_precision(device, "fp32", tf32=True)
    torch.backends.cuda.matmul.fp32_precision = "tf32"


def autocast(device: torch.device, precision: str):
    """Mixed precision as a context manager: bf16 autocast on CPU (AMX) or GPU, fp16 on GPU only.
    Weights stay fp32; matrix products run in the low-precision format."""
    if precision == "fp32":
        return contextlib.nullcontext()
    check_precision(device, precision)
    return torch.autocast(device.type, dtype=DTYPES[precision])


def matmul_peak_flops(device: torch.device, precision: str, seconds: float = 0.5) -> float:
    """Measured FLOP/s of a large square matrix product in `precision`: the roof that model FLOPs
    utilisation is reported against. Measured rather than looked up, since CPUs vary widely;
    once per process and thread count, since every `Trainer.fit` asks, and a roof measured on
    other threads than the work's is another roof (found in review: a benchmark's --threads 1
    kept a 2-thread peak). In fp32 on a CPU, the faster of MKL's product (`a @ b`) and oneDNN's,
    which fp32 training takes on an AMD CPU with AVX-512, where MKL runs its AVX2 code
    (aiayn.train_kernels)."""
    return _matmul_peak_flops(device, precision, seconds, torch.get_num_threads() if device.type == "cpu" else 0)


@functools.lru_cache(maxsize=None)
def _matmul_peak_flops(device: torch.device, precision: str, seconds: float, threads: int) -> float:
    n = 8192 if device.type == "cuda" else 2048
    dtype = DTYPES[precision]
    # A private generator: measuring must not move the global RNG that dropout draws from.
    generator = torch.Generator(device).manual_seed(0)
    a = torch.rand(n, n, device=device, generator=generator).to(dtype)
    b = torch.rand(n, n, device=device, generator=generator).to(dtype)
    products = [torch.matmul]
    if device.type == "cpu" and precision == "fp32" and torch.backends.mkldnn.is_available():
        products.append(lambda a, b: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))  # a bᵀ
    rates = []
    for product in products:
        try:
            rates.append(_flops_of(product, a, b, device, seconds / len(products)))
        except RuntimeError:  # a build whose oneDNN lacks the op: MKL's figure stands
            pass
    return max(rates)


def _flops_of(product, a: torch.Tensor, b: torch.Tensor, device: torch.device, seconds: float) -> float:
    product(a, b).sum().item()  # warm-up
    reps, start = 0, time.perf_counter()
    while True:
        product(a, b)
        reps += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and reps >= 3:
            return 2 * a.size(0) ** 3 * reps / elapsed


def resident_mib() -> Optional[float]:
    """This process's resident set (VmRSS) in MiB, where /proc tells it (Linux); else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # reported in kB
    except OSError:
        pass
    return None


def available_bytes() -> Optional[int]:
    """The memory the system can give this process now (MemAvailable, Linux), else its physical
    memory, or None where neither is known; less where this process's memory cgroup (a
    container's --memory) allows less (`cgroup_room`)."""
    found = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024  # reported in kB
                break
    except OSError:
        pass
    if found is None:
        try:
            found = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            pass
    room = cgroup_room()
    return room if found is None or (room is not None and room < found) else found


def cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> Optional[int]:
    """What the memory cgroup mounted at `root` (a container's own) still allows: its limit less
    its working set, the usage less the file pages it can drop, as its OOM killer counts; None
    where it sets no limit or none is readable. cgroup v2 (memory.max), else v1 (memory/)."""
    v1 = root / "memory"
    for limit, usage, stat, inactive in ((root / "memory.max", root / "memory.current", root / "memory.stat", "inactive_file"),
                                         (v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes", v1 / "memory.stat",
                                          "total_inactive_file")):
        try:
            cap, used = limit.read_text().strip(), int(usage.read_text())
            dropped = next((int(line.split()[1]) for line in stat.read_text().splitlines()
                            if line.split()[:1] == [inactive]), 0)
        except (OSError, ValueError, IndexError):
            continue
        if not cap.isdigit() or int(cap) >= 2**60:  # v2's "max", v1's 2^63 rounded to a page: no limit
            return None
        return max(int(cap) - (used - dropped), 0)
    return None


# glibc's malloc serves a block over its mmap threshold (which grows to 32 MiB at most) with fresh
# pages from the kernel and unmaps it when it is freed. At the paper's 25,000-token batches a
# feed-forward activation alone is 50-100 MB, so every step had the kernel fault in and zero
# gigabytes again: 9.1 million page faults and a fifth of the CPU time in the kernel over a short
# profile of Transformer-base (docs/speed-notes.md, "What made training faster"). mallopt's parameters (malloc.h):
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def malloc_tuning() -> str:
    """The user's own tuning of glibc's malloc in the environment (MALLOC_*_ variables, glibc.malloc
    tunables in GLIBC_TUNABLES) as NAME=VALUE words, or "" where there is none."""
    return " ".join(f"{name}={value}" for name, value in os.environ.items()
                    if (name.startswith("MALLOC_") and name.endswith("_")) or (name == "GLIBC_TUNABLES" and "glibc.malloc." in value))


def keep_freed_memory() -> bool:
    """Have glibc's malloc take every block from its heap and keep the freed ones there (no mmap,
    no trim), so that a training step reuses the pages of the one before. The resident set then
    stays at its high-water mark, plus what alignment slack leaves unused between large blocks
    (15.4 against 14.5 GiB at 25,000-token batches). Returns whether it was set: not where
    the C library is not glibc, nor where the user tuned malloc (MALLOC_*_ or GLIBC_TUNABLES)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if malloc_tuning():
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))  # -1: never trim


def cpu_kind(cpuinfo: Optional[str] = None) -> str:
    """The kind of development machine, for result file names and the docs' tables: intel-xeon
    (AMX), amd-epyc (Zen 4: AVX-512 with bf16, no AMX), amd-epyc-zen5 (CPU family 26: AVX-512
    with bf16 on full 512-bit units, no AMX), amd-epyc-avx2 (Zen 3: AVX2, no AVX-512, no
    hardware bf16), or the CPU's vendor otherwise. lscpu names all three AMD kinds "AMD EPYC".
    `cpuinfo`: the text of /proc/cpuinfo (read from there when not given)."""
    text = cpuinfo
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    if "GenuineIntel" in text:
        return "intel-xeon"
    if "AuthenticAMD" in text:
        family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.MULTILINE)
        if family and int(family.group(1)) >= 26:
            return "amd-epyc-zen5"
        return "amd-epyc" if " avx512f" in text else "amd-epyc-avx2"
    return platform.machine() or "unknown"


# Set to 1, a training process takes PyTorch's deterministic algorithms (`deterministic_from_environment`).
DETERMINISTIC = "AIAYN_DETERMINISTIC"


def deterministic_from_environment() -> bool:
    """With AIAYN_DETERMINISTIC=1, every operation from here on takes PyTorch's deterministic
    algorithm, and one that has none stops the process with an error that names it
    (torch.use_deterministic_algorithms). Returns whether it is on.

    An eager CPU step gives the same bits however often it is computed; a GPU step does not by
    default: the backward of the fused attention kernels (flash, memory-efficient) adds partial
    gradients with atomics, in an order that changes from run to run, so a resumed run drifts
    from the uninterrupted one by rounding, then by more. Deterministic, those kernels sum in a
    fixed order (only when an error, not a warning, is asked for: PyTorch's warn-only mode keeps
    the atomics). cuBLAS needs a fixed workspace for it, read when its first handle is made;
    memory is not filled on allocation, since aiayn reads none it has not written. Slower: for
    tests, and for proving a run reproducible."""
    if os.environ.get(DETERMINISTIC) != "1":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    return True


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process: its agent gives every worker TORCHELASTIC_RUN_ID,
    however many workers it starts."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def init_distributed(device: str = "auto") -> tuple[int, int]:
    """(rank, world size), joining the process group when launched by torchrun, whatever the
    number of processes: NCCL where `device` (a TrainConfig device) is a GPU, each process on the
    GPU of its LOCAL_RANK, else gloo. `torchrun --nproc-per-node 1` thus trains by the code each
    of 8 processes runs (DDP, the all-reduces); a process started otherwise (WORLD_SIZE unset or
    1) joins nothing. The backend follows the device rather than the machine: a CPU run on a
    machine with a GPU all-reduces CPU tensors, which NCCL cannot."""
    if process_group_joined():
        return dist.get_rank(), dist.get_world_size()
    if environment_count("WORLD_SIZE", 1) == 1 and not launched_by_torchrun():
        return 0, 1
    _stop_with_launcher()
    if resolve_device(device).type == "cuda":
        # before NCCL starts: its communicator, and every object collective, use the current GPU
        torch.cuda.set_device(local_gpu())
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    _joined.append(dist.group.WORLD)
    return dist.get_rank(), dist.get_world_size()


def local_gpu() -> int:
    """The index of this worker's GPU: its LOCAL_RANK among the GPUs it sees, or the one it sees
    where a launcher gives each process a GPU of its own (SLURM's per-task CUDA_VISIBLE_DEVICES)
    while LOCAL_RANK still counts the node's processes."""
    local, seen = environment_count("LOCAL_RANK", 0), torch.cuda.device_count()
    if seen == 1:
        return 0
    if not 0 <= local < seen:
        raise ValueError(f"LOCAL_RANK is {local} but this process sees {seen} GPU(s) (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): start at most {seen} processes a node")
    return local


def rank_gpu(device: torch.device) -> torch.device:
    """The GPU of this torchrun worker, `local_gpu()` (made current): `device` may name no
    other, since NCCL's communicator was made on that one (`init_distributed`)."""
    local = local_gpu()
    if device.index not in (None, local):
        raise ValueError(f"under torchrun each process trains on the GPU of its LOCAL_RANK (cuda:{local}), not "
                         f"{device}: give --device cuda, and CUDA_VISIBLE_DEVICES to choose the GPUs")
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


_joined: list = []  # the process group init_distributed made, if it made one


def leave_process_group() -> None:
    """Leaves the process group `init_distributed` joined, not a caller's own (NCCL warns of one
    still open at exit). Called after success only: a rank that failed leaves it to torchrun, as
    the others may be inside a collective."""
    if _joined and process_group_joined() and dist.group.WORLD is _joined.pop():
        dist.destroy_process_group()


def process_group_joined() -> bool:
    """Whether this process is in a process group (torchrun's, of any size, or its caller's)."""
    return dist.is_available() and dist.is_initialized()


def sum_over_ranks(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` (a CPU tensor) summed over the ranks of the process group, if one is joined.
    NCCL reduces GPU tensors only: on a GPU they go there and back (a few numbers a step)."""
    if not process_group_joined():
        return values
    values = values.to(device)
    dist.all_reduce(values)
    return values.cpu()


def _stop_with_launcher() -> None:
    """A worker whose torchrun is killed (even by SIGKILL, which torchrun cannot pass on) gets
    SIGTERM, and stops as it does on any SIGTERM: after the step, with a checkpoint. Without
    this the workers would train on, unseen, into a folder the user thinks is free. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the launcher was gone before the request took hold
        os.kill(os.getpid(), signal.SIGTERM)
