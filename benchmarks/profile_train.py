"""Where the time of one aiayn training step goes: torch.profiler over the steps that speed.py
times (Transformer-base, 64 pairs of 32 + 32 tokens, Adam), grouped by operator.

    .venv/bin/python benchmarks/profile_train.py --precision bf16                 # autocast
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --bf16-weights  # bf16 weights, fp32 master

Prints the operators that take the most self time on the CPU, with their share of the steps'
wall time, and writes the table into results/profile-train-KIND-PRECISION.txt.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import systems
from aiayn.device import cpu_kind, resolve_device
from common import RESULTS, command_line, default_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--bf16-weights", action="store_true", help="bf16 weights with fp32 master weights")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps, after 2 untimed ones (default 3)")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--rows", type=int, default=64, help="sentence pairs per batch (default 64, as speed.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = resolve_device("cpu")
    system = systems.build("aiayn", device, args.precision, args.threads, bf16_weights=args.bf16_weights)
    batch = systems.training_batch(args.rows, system.specials, device)
    for _ in range(2):
        system.train_step(*batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            system.train_step(*batch)
        seconds = time.perf_counter() - start
    tokens_per_s = args.rows * systems.TGT_LEN * args.steps / seconds
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = seconds * 1e6
    label = f"{args.precision}{' bf16 weights' if args.bf16_weights else ''}"
    lines = [f"# {command_line()}", f"# aiayn Transformer-base training, {label}, {cpu_kind()}, {args.threads} threads: "
             f"{tokens_per_s:,.0f} target tokens/s over {args.steps} profiled steps ({seconds:.2f} s)",
             f"{'operator':<48} {'self ms/step':>12} {'share':>7} {'calls/step':>10}"]
    for event in events[:25]:
        per_step = event.self_cpu_time_total / args.steps / 1e3
        lines.append(f"{event.key[:48]:<48} {per_step:>12.1f} {event.self_cpu_time_total / total_us:>7.1%} "
                     f"{event.count / args.steps:>10.0f}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = RESULTS / f"profile-train-{cpu_kind()}-{args.precision}{'-bf16-weights' if args.bf16_weights else ''}.txt"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
