"""What the benchmark commands share: the fresh-process runner, timing and memory readings,
statistics, the machine description and result files."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar, Union

import torch

from aiayn.device import check_precision, cpu_kind, fast_bf16, matmul_peak_flops, resolve_device
from aiayn.files import atomic_text, refuse_to_replace

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ONE_CASE = HERE / "one_case.py"
# Peers that train, each in its own environment (benchmarks/setup_train_peers.sh), measured by
# its harness in benchmarks/peers/: the environment's python and the harness.
PEER_ENVS = {
    "eole": (HERE / ".venv-eole" / "bin" / "python", HERE / "peers" / "eole_peer.py"),
    "onmt": (HERE / ".venv-peers" / "bin" / "python", HERE / "peers" / "onmt_peer.py"),
}


def default_threads() -> int:
    """The cores this process may run on (every system gets the same number)."""
    return len(os.sched_getaffinity(0))


def require_precision(*precisions: str, device: torch.device = torch.device("cpu")) -> None:
    """Stop in aiayn's one line where `device` cannot run one of `precisions` (bf16 on a CPU
    without hardware bf16), before a benchmark starts work that would fail or crawl."""
    for precision in precisions:
        try:
            check_precision(device, precision)
        except ValueError as error:
            sys.exit(f"{Path(sys.argv[0]).stem}: {precision}: {error}")


def device_or_exit(name: str) -> torch.device:
    """The device `name` (aiayn.device.resolve_device), or this script's one-line exit."""
    return or_exit(lambda: resolve_device(name))


def decoding_precision(device: torch.device) -> str:
    """The decoding precision of a benchmark not told one: bf16 on a GPU, fp32 on a CPU."""
    return "bf16" if device.type == "cuda" else "fp32"


def matmul_precision(precision: str, device: torch.device) -> str:
    """The precision to build a system with: tf32 is fp32 with TF32 matrix products allowed
    (cuBLAS and cuDNN) for the whole process."""
    if precision != "tf32":
        return precision
    if device.type != "cuda":
        sys.exit(f"{Path(sys.argv[0]).stem}: tf32 is a CUDA GPU's format; use fp32 on a CPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return "fp32"


def run_case(args: list[str], threads: int, peer: Optional[str] = None, peer_python: Optional[Path] = None) -> dict:
    """Run one measurement in a fresh process (`one_case.py ARGS`, or a peer's harness in the
    peer's environment, or under `peer_python` where the peer is installed elsewhere) and return
    its JSON line, or {"error": ...} so that one failure does not end a long run. Thread counts
    are also fixed through the environment, for the OpenMP pools that torch.set_num_threads does
    not reach."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if peer:
        python, harness = PEER_ENVS[peer]
        program = [str(peer_python or python), str(harness)]
    else:
        program = [sys.executable, str(ONE_CASE)]
    proc = subprocess.run([*program, *args], capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    return {"error": "\n".join(proc.stderr.strip().splitlines()[-8:]) or f"exit status {proc.returncode}, no result line"}


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer reads the work's end, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall-clock seconds of a block, synchronized with the device at both ends."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "Timer":
        synchronize(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.start


def status_mib(field: str, pid: Union[int, str] = "self") -> float:
    """A memory line of /proc/PID/status (VmRSS: now, VmHWM: peak), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # reported in kB
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def tree_rss_mib(pid: int) -> float:
    """The resident memory of process `pid` and all its descendants (a server's worker
    processes), in MiB."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            total += status_mib("VmRSS", current)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):  # it exited while being read: it holds nothing
            continue
    return total


def memory_mib(device: torch.device) -> float:
    """Memory in use now: resident set on CPU, torch's allocated memory on a GPU."""
    return torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else status_mib("VmRSS")


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory of this process so far: peak resident set (VmHWM) on CPU, the peak of
    torch's allocator on a GPU."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else status_mib("VmHWM")


def spread(values: list[float]) -> dict:
    """Median and range of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def peak_share(tflops: dict, roof: dict) -> float:
    """A system's median TFLOP/s (a `spread`) as a share of the matmul peak measured in the same
    run: of the highest of the peak's repetitions, the least the device is known to reach. The
    median was taken before, and a run whose peak measurements spread 0.12 to 0.18 TFLOP/s put
    aiayn at 113% of it (found in review)."""
    return tflops["median"] / roof["max"]


def _version(package: str) -> Optional[str]:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(device: torch.device, threads: int) -> dict:
    """What the numbers were measured on, with the device's matmul peak in fp32 (and bf16 where
    it is hardware) measured now, on `threads` threads (aiayn.device.matmul_peak_flops, once per
    process and thread count): a CPU of one name can be twice as fast as another, so every result file says
    how fast its machine was. Call it while nothing else runs (before servers or peers start, or
    after they stop)."""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
        platform.processor() or "unknown",
    )
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), [])
    before = torch.get_num_threads()
    if device.type == "cpu":  # the roof of the threads the work runs on (found in review: all cores' for --threads 1)
        torch.set_num_threads(threads)
    try:
        peaks = {precision: round(matmul_peak_flops(device, precision) / 1e12, 3)
                 for precision in ("fp32", "bf16") if precision == "fp32" or fast_bf16(device)}
    finally:
        torch.set_num_threads(before)
    return {
        "cpu": cpu,
        "cpu_kind": cpu_kind(),  # the name results and docs' tables go by (found in review: not recorded)
        "cpu_flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags],  # bf16/int8 speed
        "logical_cpus": os.cpu_count(),
        "cpus_available": default_threads(),
        "threads_used": threads,
        "matmul_peak_tflops": peaks,
        "peak_threads": threads if device.type == "cpu" else None,
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "python": platform.python_version(),
        "os": platform.platform(),
        "versions": {p: _version(p) for p in ("aiayn", "torch", "transformers", "ctranslate2", "numpy")},
        "revision": revision(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def revision(checkout: Optional[Path] = None) -> Optional[str]:
    """The git commit of `checkout` (by default this one: aiayn may run from it uninstalled), "+"
    if it has changes; for this one, AIAYN_REVISION where it is a copy without its history (a
    lent GPU machine)."""
    if checkout is None and os.environ.get("AIAYN_REVISION"):
        return os.environ["AIAYN_REVISION"]
    folder = checkout or HERE
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=folder, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=folder, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "") if head.returncode == 0 else None


def command_line() -> str:
    """How this script was run, with its path relative to the repository when it lies inside."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(HERE.parent) if script.is_relative_to(HERE.parent) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])  # quoted as a shell takes it back


def replace_runs_folder(runs: Path, force: bool, made: Callable[[str], bool]) -> None:
    """Remove `runs`, the folder of an earlier call's run folders, where `force` asks for it; but
    never the current folder or one above it, nor a folder holding anything this script does not
    make (`made(name)` of each entry, a training run's own files among them): --force replaces the
    script's own runs, not whatever --runs names (found in a misuse hunt: --runs RUN --force
    deleted a training run, and --runs . would delete the current folder)."""
    if not runs.exists():
        return
    name = Path(sys.argv[0]).stem
    if not force:
        sys.exit(f"{name}: {runs} exists: pass --force to replace it")
    here = Path.cwd().resolve()
    strangers = sorted(entry.name for entry in runs.iterdir() if not made(entry.name)) if runs.is_dir() else [runs.name]
    if runs.resolve() in (here, *here.parents) or strangers:
        sys.exit(f"{name}: {runs} is not the folder of an earlier call's runs"
                 f"{' (it holds ' + ', '.join(strangers[:3]) + ')' if strangers else ''}: choose another --runs")
    shutil.rmtree(runs)


def or_exit(load: Callable[[], T]) -> T:
    """`load()` of a script's input (a model, a run, a data folder), or the script's one-line exit
    where aiayn refuses it: a missing folder is the user's mistake, not a traceback."""
    try:
        return load()
    except (OSError, ValueError) as error:
        sys.exit(f"{Path(sys.argv[0]).stem}: {error}")


def default_output(kind: str, device: torch.device, quick: bool) -> Path:
    """results/KIND-DEVICE.json; quick (smoke test) runs go to a separate, git-ignored file."""
    return RESULTS / f"{kind}-{device.type}{'-quick' if quick else ''}.json"


def write_results(path: Path, results: dict, quiet: bool = False) -> None:
    """Write atomically: a run stopped while writing leaves the previous file whole."""
    or_exit(lambda: atomic_text(path, json.dumps(results, indent=1) + "\n"))
    if not quiet:
        print(f"wrote {path}")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (found in review: --reps 0 measured nothing
    and wrote a file of empty results, --threads 0 and --calls -1 were tracebacks)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, not {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return 0 if text.strip() == "0" else positive_int(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (minutes, seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"give a number above 0, not {text!r}")
    return value


def parse_args(parser: argparse.ArgumentParser,
               inputs: Callable[[argparse.Namespace], list] = lambda args: []) -> argparse.Namespace:
    """The script's arguments, with `--force` and, where `--out` names a file, that file checked
    before any measuring (found in review: an existing --out was replaced, and one that could
    not be written failed with a traceback at the end of a long run). A file that git holds as
    committed in results/ or docs/ is replaced without `--force` (git keeps it: re-measuring
    results/ is what these commands are for), and so are the default outputs, the repository's
    records of the last measurement. `inputs(args)`: what the script reads (a model, a run),
    which --out may never replace, --force or not."""
    with contextlib.suppress(argparse.ArgumentError):  # a script whose --force replaces its run folders too
        parser.add_argument("--force", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    out = getattr(args, "out", None)
    if out is not None and out != parser.get_default("out"):
        check_output(out, args.force, [Path(p) for p in inputs(args) if p is not None])
    return args


def check_output(path: Path, force: bool, inputs: list[Path] = ()) -> None:
    """A results file a run will write, checked before it measures: one line and exit 2 where it
    exists (unless `force`, or git holds it unchanged) or cannot be written, and never one of
    `inputs` or inside one (found in a misuse hunt: int8_quality.py RUN --out RUN/model.safetensors
    --force replaced the model it had just read)."""
    or_exit(lambda: refuse_to_replace(path, force or _committed(path), inputs=inputs, folder=False))


def _committed(path: Path) -> bool:
    """Whether git holds `path` as it is now (tracked, unchanged), in results/ or docs/: the
    records these commands re-measure (found in a misuse hunt: --out Makefile, or any other file
    of the repository, was replaced without --force)."""
    if not path.is_file() or not any(path.resolve().is_relative_to(kept) for kept in (RESULTS, HERE.parent / "docs")):
        return False
    where = dict(capture_output=True, cwd=path.resolve().parent, timeout=10)
    try:
        return subprocess.run(["git", "ls-files", "--error-unmatch", path.name], **where).returncode == 0 and \
            subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path.name], **where).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
