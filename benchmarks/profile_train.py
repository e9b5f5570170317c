"""Where the time of one aiayn training step goes: torch.profiler over the steps that speed.py
times (Transformer-base, Adam; the fixed batch of 64 pairs of 32 + 32 tokens, or real batch
shapes of a token budget), grouped by operator.

    .venv/bin/python benchmarks/profile_train.py --precision bf16                 # autocast
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --bf16-weights  # bf16 weights, fp32 master
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --budget 2000   # speed.py's 2,000-token batches
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --budget 2000 --compile  # the compiled step

With --compile the warm-up steps compile the step (TrainConfig.compile), and each kernel Inductor
generates is its own row (its cpp.enable_kernel_profile), so the table shows which fused kernels
take the time the matrix products leave.

Prints the operators that take the most self time on the CPU, with their share of the steps'
wall time, and writes the table into results/profile-train-KIND-PRECISION.txt.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import systems
from aiayn.device import cpu_kind, resolve_device
from common import RESULTS, command_line, default_threads, require_precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--bf16-weights", action="store_true", help="bf16 weights with fp32 master weights")
    parser.add_argument("--compile", action="store_true", help="the compiled step, each generated kernel a row")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps, after 2 untimed ones (default 3)")
    parser.add_argument("--threads", type=int, default=default_threads())
    batches = parser.add_mutually_exclusive_group()
    batches.add_argument("--rows", type=int, default=64, help="the fixed batch: pairs of 32 + 32 tokens (default 64, as speed.py)")
    batches.add_argument("--budget", type=int, help="real batch shapes of this token budget instead, one per profiled "
                         "step, as speed.py cuts them")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = resolve_device("cpu")
    require_precision(args.precision, device=device)
    if args.compile:
        from torch._inductor import config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    system = systems.build("aiayn", device, args.precision, args.threads, compile=args.compile,
                           bf16_weights=args.bf16_weights)
    if args.budget:
        with tempfile.TemporaryDirectory() as scratch:
            shapes = systems.corpus_shapes(systems.corpus_lengths(Path(scratch)), args.budget, args.steps)
    else:
        shapes = [systems.fixed_shape(args.rows)] * args.steps
    batches = [systems.shaped_batch(shape, system.specials, device) for shape in shapes]
    for batch in batches[:2]:
        system.train_step(*batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for batch in batches:
            system.train_step(*batch)
        seconds = time.perf_counter() - start
    tokens_per_s = systems.target_tokens(shapes) / seconds
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = seconds * 1e6
    label = f"{args.precision}{' bf16 weights' if args.bf16_weights else ''}{' compiled' if args.compile else ''}" + \
        (f", {args.budget}-token batches" if args.budget else f", {args.rows} x 32 + 32")
    lines = [f"# {command_line()}", f"# aiayn Transformer-base training, {label}, {cpu_kind()}, {args.threads} threads: "
             f"{tokens_per_s:,.0f} target tokens/s over {args.steps} profiled steps ({seconds:.2f} s)",
             f"{'operator':<48} {'self ms/step':>12} {'share':>7} {'calls/step':>10}"]
    for event in events[:25]:
        per_step = event.self_cpu_time_total / args.steps / 1e3
        lines.append(f"{event.key[:48]:<48} {per_step:>12.1f} {event.self_cpu_time_total / total_us:>7.1%} "
                     f"{event.count / args.steps:>10.0f}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = RESULTS / (f"profile-train-{cpu_kind()}-{args.precision}{'-bf16-weights' if args.bf16_weights else ''}"
                     f"{'-compiled' if args.compile else ''}"
                     f"{f'-{args.budget}' if args.budget else ''}.txt")
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
