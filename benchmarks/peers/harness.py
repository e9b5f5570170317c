"""What the peers' harnesses share: their command line, their one-JSON-line output, the stop of a
training child after a wall-clock budget, and the process's memory readings.

Standard library only: each harness runs in its peer's own environment, where aiayn is not
installed (benchmarks/setup_train_peers.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional


class UserError(Exception):
    """A bad argument or an unsupported case: one line on stderr and exit status `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: now, VmHWM: peak) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_mib(device: str = "cpu") -> float:
    """Memory in use now: resident set (VmRSS) on the CPU, torch's allocated memory on a GPU."""
    if device == "cuda":
        import torch

        return torch.cuda.memory_allocated() / 2**20
    return status_mib("VmRSS")


def peak_memory_mib(device: str = "cpu") -> float:
    """Peak memory of this process so far: peak resident set (VmHWM) on the CPU, the peak of
    torch's allocator on a GPU (as aiayn's benchmarks/common.py reads them)."""
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return status_mib("VmHWM")


def synchronize(device: str = "cpu") -> None:
    """Wait for the GPU's queued work, so that a clock reads the work's end, not its launch."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# `speed --model`: Table 3's base and big shapes (both 6 + 6 layers)
SPEED_MODELS = {
    "base": {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "dropout": 0.1},
    "big": {"layers": 6, "d_model": 1024, "heads": 16, "d_ff": 4096, "dropout": 0.3},
}


def speed_device(args: argparse.Namespace) -> str:
    """`speed`'s device (cpu where the harness offers no --device), with --tf32 applied: TF32
    matrix products (cuBLAS and cuDNN) for the whole process, which PyTorch leaves off for fp32."""
    device = getattr(args, "device", "cpu")
    if getattr(args, "tf32", False):
        if device != "cuda":
            raise UserError("--tf32 is a CUDA GPU's format; leave it out with --device cpu")
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: torch sees no CUDA GPU")
    return device


def thread_env(threads: int, **extra: str) -> dict:
    """The environment with OpenMP and MKL held to `threads` (torch sizes its pool from it)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **extra)


def set_threads(threads: int) -> None:
    """Run this process on `threads` threads: the environment first, read as torch loads."""
    os.environ.update(thread_env(threads))
    import torch

    torch.set_num_threads(threads)


def speed_shapes(args: argparse.Namespace) -> list[dict]:
    """The batch shapes `speed` times, each once: the `--shapes` file (aiayn's benchmarks/systems.py
    writes it: {"src": [source ids + EOS per row], "tgt": [target ids + 1 per row]}), or `--steps`
    copies of the fixed batch of `--rows` pairs of `--src-len` + `--tgt-len` positions."""
    if args.shapes:
        shapes = json.loads(Path(args.shapes).read_text())
        if not shapes or any(min(shape["src"] + shape["tgt"]) < 2 for shape in shapes):
            raise UserError(f"{args.shapes}: need at least one batch, every length at least 2")
        return shapes
    if min(args.src_len, args.tgt_len) < 2 or min(args.rows, args.steps) < 1:
        raise UserError("need --src-len and --tgt-len >= 2, --rows and --steps >= 1")
    return [{"src": [args.src_len] * args.rows, "tgt": [args.tgt_len] * args.rows}] * args.steps


def padded_ids(lengths: list[int], vocab: int, generator, last: int, pad: int):
    """(rows, longest) random content ids (from [4, vocab - 1), clear of every special id), row
    i holding lengths[i] - 1 of them, then `last`, then `pad` up to the longest."""
    import torch

    lengths_t = torch.tensor(lengths).unsqueeze(1)  # (rows, 1)
    ids = torch.randint(4, vocab - 1, (len(lengths), max(lengths)), generator=generator)
    positions = torch.arange(ids.size(1))
    ids = ids.masked_fill(positions >= lengths_t - 1, last)
    return ids.masked_fill(positions >= lengths_t, pad)


def measure_speed(args: argparse.Namespace, steps: list[Callable[[], None]], tokens: int, model, start_mib: float,
                  precision_mode: str) -> dict:
    """`speed`'s result: `steps` (one training step per batch shape) timed once each after
    `args.warmup` untimed ones from the start of the list, in real (non-pad) target tokens/s,
    `tokens` being the timed batches' ids + EOS, with the process's memory (on a GPU, torch's
    allocator) and the model's parameter count. On a GPU the clock is read after the queued work
    is done, at both ends."""
    device = getattr(args, "device", "cpu")
    for i in range(args.warmup):
        steps[i % len(steps)]()
    synchronize(device)
    begin = time.perf_counter()
    for step in steps:
        step()
    synchronize(device)
    seconds = time.perf_counter() - begin
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "peak_mib": peak_memory_mib(device),
        "start_mib": start_mib,
        "parameters": sum(p.numel() for p in model.parameters()),
        "precision_mode": precision_mode,
        "norm": "pre",  # neither peer offers post-norm in its decoder
    }


_running: set[int] = set()  # the process groups of the `run_for` children alive now
# Held from a child's launch until it is in `_running`: a signal that came between the two found
# the child not yet listed, and left it running (seen under load, in tests/test_benchmarks.py).
# Reentrant, for the signal handler that interrupts a launch on the main thread itself.
_launching = threading.RLock()


def stop_children_on_signals() -> None:
    """SIGTERM or SIGINT to this process (`timeout`, `kill`, Ctrl-C) SIGTERMs the process groups
    of `run_for`'s children first, then ends this process as the signal would: they run in
    sessions of their own, which a signal to this one does not reach, and a benchmark that runs
    them on worker threads hears of it only in its main thread (found in review: a stopped
    learning_curve.py left its trainings running). Call it from the main thread."""
    def stop(signum: int, frame) -> None:
        with _launching:  # a launch on a worker thread ends first, its child listed
            groups = list(_running)
        for group in groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def run_for(command: list[str], minutes: float, log: Path, env: dict, grace_s: float = 30) -> tuple[bool, float]:
    """Run a training `command` (output into `log`) until it exits or `minutes` of wall clock have
    passed since its launch; then SIGTERM its process group, and SIGKILL after `grace_s`.
    Returns (whether it exited by itself, wall seconds). The child has a session of its own, so
    that the stop reaches every process it started; a Ctrl-C here stops it too.

    SIGTERM rather than SIGINT: a child of a background job inherits SIGINT ignored, and neither
    peer saves anything when stopped, so a gentler stop would gain nothing."""
    with open(log, "w", encoding="utf-8") as handle:
        begin = time.monotonic()
        with _launching:
            child = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            _running.add(child.pid)

        def stop() -> None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()

        try:
            child.wait(timeout=minutes * 60)
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
            stop()
        except BaseException:
            stop()
            raise
        finally:
            _running.discard(child.pid)
        return finished, time.monotonic() - begin


def parse_args(description: str, argv: Optional[list[str]] = None, speed_options: bool = False) -> argparse.Namespace:
    """The command line every harness takes (speed, train, translate); `speed_options` adds
    speed's --device, --model and --tf32 (the harnesses that implement them)."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    precision = {"choices": ("fp32", "bf16"), "default": "fp32"}

    model = "Transformer-base or -big" if speed_options else "Transformer-base"
    speed = sub.add_parser("speed", help=f"training throughput of {model} on the fixed batch or on real batch shapes")
    speed.add_argument("--precision", **precision)
    if speed_options:
        speed.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                           help="cuda: the model, batches and optimizer on GPU 0 (--threads still sets the CPU threads)")
        speed.add_argument("--model", choices=tuple(SPEED_MODELS), default="base",
                           help="Table 3's base (d_model 512, 8 heads, d_ff 2048, dropout 0.1) or big "
                                "(d_model 1024, 16 heads, d_ff 4096, dropout 0.3), 6 + 6 layers")
        speed.add_argument("--tf32", action="store_true",
                           help="--device cuda only: fp32 with TF32 matrix products (cuBLAS and cuDNN) allowed")
    for name, default in (("rows", 64), ("src-len", 32), ("tgt-len", 32), ("vocab", 8000), ("warmup", 2),
                          ("steps", 5), ("seed", 0)):
        speed.add_argument(f"--{name}", type=int, default=default)
    speed.add_argument("--threads", type=int, required=True)
    speed.add_argument("--shapes", type=Path, help="real batch shapes (a JSON list), instead of --rows x --src-len + --tgt-len")

    train = sub.add_parser("train", help="the peer's training CLI on pre-tokenized data for a time budget")
    train.add_argument("--data", type=Path, required=True, help="train.src, train.tgt (pieces), vocab.txt")
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--minutes", type=float, required=True, help="wall clock from the child's launch")
    train.add_argument("--max-steps", type=int, help="stop after this many optimizer steps, if the clock has not stopped it")
    train.add_argument("--threads", type=int, required=True)
    train.add_argument("--precision", **precision)
    for name, kind, default in (("layers", int, 3), ("d-model", int, 256), ("heads", int, 4), ("d-ff", int, 1024),
                                ("dropout", float, 0.1), ("label-smoothing", float, 0.1), ("max-tokens", int, 3000),
                                ("warmup-steps", int, 300), ("lr-scale", float, 0.5), ("seed", int, 1),
                                ("save-every", int, 50), ("keep-last", int, 5)):
        train.add_argument(f"--{name}", type=kind, default=default)
    train.add_argument("--no-output-bias", action="store_true",
                       help="Eole only, an ablation: no bias on the output layer (Eole's generator has one)")

    translate = sub.add_parser("translate", help="beam search with the peer's own decoder")
    translate.add_argument("--model", type=Path, required=True, help="a checkpoint that `train` reported")
    translate.add_argument("--src", type=Path, required=True, help="one sentence of pieces per line")
    translate.add_argument("--out", type=Path, required=True)
    translate.add_argument("--beam", type=int, default=4)
    translate.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty (§6.1: 0.6)")
    translate.add_argument("--extra-len", type=int, default=50, help="output limit: source length + this")
    translate.add_argument("--threads", type=int, required=True)
    translate.add_argument("--batch-tokens", type=int, default=4096)
    translate.add_argument("--precision", **precision)

    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(name: str, description: str, commands: dict[str, Callable[[argparse.Namespace], dict]],
         fairness_notes: list[str], speed_options: bool = False) -> None:
    """Run the subcommand; print its result (with the fairness notes) as one JSON line on
    stdout, or a user error as one line on stderr with its exit status. `speed_options`: the
    harness's speed takes --device, --model and --tf32."""
    args = parse_args(description, speed_options=speed_options)
    try:
        result = commands[args.command](args)
    except UserError as error:
        print(f"{name} {args.command}: {error}", file=sys.stderr)
        sys.exit(error.code)
    print(json.dumps({**result, "fairness_notes": fairness_notes}), flush=True)
