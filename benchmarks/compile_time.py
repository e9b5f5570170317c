"""How long the compiled training step (`--compile true`, aiayn.train.TrainStep) takes to compile:
the first step of a fresh process, which compiles the one graph with symbolic sizes, and a step
of another batch shape, which must reuse it. With --other, another checkout's in turn
(this, other, this, ...), each importing the aiayn of its own checkout. Inductor's on-disk cache
of C++ kernels is shared, as between a user's runs: one untimed process of each checkout first
compiles the kernels the timed ones then find, whichever checkout comes first.

    .venv/bin/python benchmarks/compile_time.py                          # the demo's model, fp32
    git worktree add /tmp/before HEAD~3
    .venv/bin/python benchmarks/compile_time.py --other /tmp/before --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from aiayn.config import PRESETS
from common import (HERE, RESULTS, command_line, cpu_kind, default_threads, machine, parse_args, positive_int,
                    require_precision, revision, spread, write_results)

# One process's measurement, run with the checkout's aiayn on the path; prints one JSON line.
PROBE = """
import json, sys, time, torch
from aiayn.batching import collate
from aiayn.config import TrainConfig, demo_model, preset
from aiayn.model import Transformer
from aiayn.optim import make_optimizer
from aiayn.train import TrainStep
name, precision, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(threads)
torch.manual_seed(0)
config = demo_model() if name == "demo" else preset(name)
model = Transformer(config).train()
step = TrainStep(model, make_optimizer(model), TrainConfig(precision=precision, compile=True), torch.device("cpu"))
ids = torch.Generator().manual_seed(0)
seconds = []
for rows, length in ((32, 20), (24, 27)):  # the second shape reuses the graph
    pairs = [(torch.randint(4, config.vocab_size, (length,), generator=ids).tolist(),
              torch.randint(4, config.vocab_size, (length + 2,), generator=ids).tolist()) for _ in range(rows)]
    batch = collate(pairs, config.pad_id, config.bos_id, config.eos_id)
    start = time.perf_counter()
    step([batch], batch.n_tgt_tokens)
    seconds.append(time.perf_counter() - start)
print(json.dumps({"compile_step_s": seconds[0], "next_shape_step_s": seconds[1], "graphs": step.compiles}))
"""


def measure(checkout: Path, model: str, precision: str, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", PROBE, model, precision, str(threads)], capture_output=True,
                          text=True, cwd=checkout, env=env)
    if done.returncode != 0:
        sys.exit(f"compile_time.py: the probe failed in {checkout}:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["graphs"] != 1:
        sys.exit(f"compile_time.py: {checkout} compiled {result['graphs']} graphs, not one: the second shape's "
                 "time would hold a compile")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", choices=("demo", *PRESETS),  # (found in a misuse hunt: a traceback)
                        help="demo (the demo's model) or a preset (default demo)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--other", type=Path, help="another checkout of aiayn, measured in turn with this one")
    parser.add_argument("--reps", type=positive_int, default=2, help="fresh processes of each checkout (default 2)")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, help="result file (default results/compile-time-KIND-MODEL-PRECISION.json)")
    args = parse_args(parser)
    if args.reps < 1:
        parser.error("--reps takes 1 or more")
    require_precision(args.precision)
    if args.other and not (args.other / "aiayn" / "train.py").is_file():
        parser.error(f"--other {args.other}: no aiayn checkout there")
    sides = {"this": HERE.parent, **({"other": args.other.resolve()} if args.other else {})}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for checkout in sides.values():  # untimed: the C++ kernels into the cache
        measure(checkout, args.model, args.precision, args.threads)
    for rep in range(args.reps):
        for side, checkout in sides.items():
            runs[side].append(measure(checkout, args.model, args.precision, args.threads))
            print(f"[{rep + 1}/{args.reps}] {side}: {runs[side][-1]}", flush=True)
    summary = {side: {key: spread([r[key] for r in rs]) for key in ("compile_step_s", "next_shape_step_s")}
               for side, rs in runs.items()}
    for side, s in summary.items():
        print(f"{side}: compiling step {s['compile_step_s']['median']:.1f} s "
              f"({s['compile_step_s']['min']:.1f}–{s['compile_step_s']['max']:.1f})")
    heads = {side: revision(checkout) for side, checkout in sides.items()}
    results = {"benchmark": "compile_time", "command": command_line(),
               "machine": machine(torch.device("cpu"), args.threads),
               "settings": {"model": args.model, "precision": args.precision, "reps": args.reps, "revisions": heads},
               "summary": summary, "runs": runs}
    write_results(args.out or RESULTS / f"compile-time-{cpu_kind()}-{args.model}-{args.precision}.json", results)


if __name__ == "__main__":
    main()
