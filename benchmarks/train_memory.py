"""The resident memory of training over its steps, with oneDNN's cache of compiled kernels bounded
as aiayn bounds it (aiayn.kernel_cache.KERNEL_CACHE_CAPACITY) and at oneDNN's own default (1,024).

    .venv/bin/python benchmarks/train_memory.py --steps 400       # two demo runs, ~6 min -> docs/train-memory-KIND.png
    .venv/bin/python benchmarks/train_memory.py --plot runs/demo --out x.png   # any run folders' logs

Each run is the demo's training (aiayn.config.demo_model and demo_training, bf16, seed 1; since
2026-11-25 a bf16 copy of the model, the fast recipe's) for
--steps steps in a fresh process; the second one is given ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024. Both read the
`rss_mib` that `aiayn train` writes into every training record of log.jsonl. Prints each run's
first, last and largest reading and writes results/train-memory-KIND.json (with --out, the JSON
beside the PNG: OUT with .json for .png).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

from aiayn.files import atomic_write
from aiayn.device import cpu_kind
from aiayn.kernel_cache import KERNEL_CACHE_CAPACITY
from aiayn.run import LOG, read_log
from common import (HERE, RESULTS, check_output, command_line, machine, parse_args, positive_float, positive_int,
                    replace_runs_folder, require_precision, write_results)

# Each variant's size of oneDNN's kernel cache, given to a fresh process before it imports aiayn.
VARIANTS = {"bounded": (str(KERNEL_CACHE_CAPACITY), f"{KERNEL_CACHE_CAPACITY} kernels cached (aiayn's default)"),
            "onednn": ("1024", "1,024 kernels cached (oneDNN's default)")}


def child(run: Path, steps: int) -> None:
    """One demo training of `steps` steps (in this fresh process)."""
    import aiayn.train
    from aiayn.config import demo_model, demo_training

    recipe = demo_training(max_steps=steps, eval_every=10**9, save_every=10**9, precision="bf16", seed=1)
    aiayn.train.train_run(demo_model(), recipe, run, echo=lambda *_: None)


def records(run: Path) -> list[dict]:
    """The training records of a run's log that carry an RSS reading."""
    log = run / LOG
    if not log.is_file():
        sys.exit(f"{log} not found: give run folders of `aiayn train` or `aiayn demo`")
    found = [r for r in read_log(log) if r.get("split") == "train" and r.get("rss_mib") is not None]
    if not found:
        sys.exit(f"{log} has no rss_mib readings (written by aiayn train since this version)")
    return found


def readings(run: Path) -> list[tuple[int, float]]:
    """(step, RSS MiB) of every training record of a run's log that has both."""
    return [(r["step"], r["rss_mib"]) for r in records(run)]


def range_from(run: Path, minute: float) -> tuple[float, float]:
    """The smallest and largest RSS MiB of a run's training records from `minute` of training on."""
    mib = [r["rss_mib"] for r in records(run) if r["elapsed_s"] >= minute * 60]
    if not mib:
        sys.exit(f"{run} has no rss_mib reading after minute {minute:g}")
    return min(mib), max(mib)


def plot(curves: dict[str, list[tuple[int, float]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for label, points in curves.items():
        steps, mib = zip(*points)
        axes.plot(steps, mib, label=label)
    axes.set_xlabel("training step")
    axes.set_ylabel("resident set (MiB)")
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    atomic_write(out, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    plt.close(figure)
    print(f"wrote {out}")


def summary(points: list[tuple[int, float]]) -> dict:
    return {"first": {"step": points[0][0], "mib": round(points[0][1])}, "last": {"step": points[-1][0], "mib": round(points[-1][1])},
            "largest_mib": round(max(m for _, m in points))}


def results_file(out: Optional[Path]) -> Path:
    """Where the JSON goes: beside a given --out (found in review: it went to results/ whatever
    --out said, over the committed file), else results/."""
    return out.with_suffix(".json") if out else RESULTS / f"train-memory-{cpu_kind()}.json"


def main() -> None:
    if sys.argv[1:2] == ["_child"]:  # _child RUN STEPS
        child(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=400, help="training steps of each run (default 400)")
    parser.add_argument("--runs", type=Path, default=Path("runs/train-memory"), help="folder of the two run folders")
    parser.add_argument("--plot", nargs="+", type=Path, metavar="RUN_DIR", help="only plot these runs' logs")
    parser.add_argument("--labels", nargs="+", help="with --plot: the runs' names in the legend (default: their folder names)")
    parser.add_argument("--from-minutes", nargs="+", type=positive_float, default=[], metavar="M",
                        help="with --plot: also print each run's smallest and largest reading from minute M of training on")
    parser.add_argument("--out", type=Path, help=f"the PNG (default docs/train-memory-{cpu_kind()}.png); "
                                                 "the results go beside it, .json for .png")
    parser.add_argument("--force", action="store_true", help="replace the run folders of an earlier call")
    args = parse_args(parser)
    out = args.out or HERE.parent / "docs" / f"train-memory-{cpu_kind()}.png"  # not the current folder's docs/ (found in a misuse hunt)
    results = results_file(args.out)
    if args.out and not args.plot:
        check_output(results, args.force)
    if args.labels and (not args.plot or len(args.labels) != len(args.plot)):
        sys.exit("--labels needs --plot and one label per run folder")
    if args.from_minutes and not args.plot:
        sys.exit("--from-minutes needs --plot")
    if args.plot:
        curves = {label: readings(run) for label, run in zip(args.labels or [run.name for run in args.plot], args.plot)}
    else:
        if args.steps < 1:
            sys.exit("--steps must be at least 1")
        require_precision("bf16")  # the demo's training in bf16
        replace_runs_folder(args.runs, args.force, lambda name: name in VARIANTS)
        curves = {}
        for variant, (capacity, label) in VARIANTS.items():
            print(f"training {args.steps} steps: {label}...", flush=True)
            env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": capacity}
            subprocess.run([sys.executable, __file__, "_child", str(args.runs / variant), str(args.steps)], env=env, check=True)
            curves[label] = readings(args.runs / variant)
    for label, points in curves.items():
        s = summary(points)
        print(f"{label}: {s['first']['mib']:,} MiB at step {s['first']['step']}, {s['last']['mib']:,} MiB at step "
              f"{s['last']['step']}, largest {s['largest_mib']:,} MiB")
    for label, run in zip(curves, args.plot or []):
        for minute in args.from_minutes:
            low, high = range_from(run, minute)
            print(f"{label}: from minute {minute:g}: {low:,.0f}-{high:,.0f} MiB")
    plot(curves, out, "Resident memory of the demo's training")
    if not args.plot:
        write_results(results, {
            "benchmark": "train-memory", "command": command_line(), "machine": machine(torch.device("cpu"), torch.get_num_threads()),
            "settings": {"steps": args.steps, "preset": "small", "precision": "bf16"},
            "runs": {label: {**summary(points), "readings": points} for label, points in curves.items()},
        })


if __name__ == "__main__":
    main()
