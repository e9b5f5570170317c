"""Where the time of aiayn's decoding goes: torch.profiler over one call of speed.py's decoding
case (Transformer-base, 64 sentences of 32 tokens, every output forced to 32 tokens).

    .venv/bin/python benchmarks/profile_decode.py --precision fp32 --beam 4        # a CPU
    python benchmarks/profile_decode.py --device cuda --precision bf16 --cuda-graphs  # a GPU, each step one graph

On a GPU a step is the host queueing kernels (or replaying a graph) and the search's few
operations, then one read of the step's counts, so the table gives both sides: the share of the
call's wall time the GPU was busy and its kernels by kind, and the host's operators by their own
CPU time. Writes it into results/profile-decode-KIND-PRECISION-beamK[-graphs].txt, or --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import systems
from aiayn.device import cpu_kind
from aiayn.files import atomic_text
from common import (RESULTS, Timer, command_line, decoding_precision, default_threads, device_or_exit, machine, or_exit,
                    parse_args, positive_int, require_precision)
from profile_train import gpu_kernels, gpu_summary


def table(title: str, events: list, own, total_us: float, calls: int, rows: int) -> list[str]:
    lines = [f"{title:<64} {'self ms/call':>12} {'share':>7} {'calls/call':>10}"]
    for event in sorted(events, key=own, reverse=True)[:rows]:
        lines.append(f"{event.key[:64]:<64} {own(event) / calls / 1e3:>12.2f} {own(event) / total_us:>7.1%} "
                     f"{event.count / calls:>10.0f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--model", choices=systems.MODELS, default="base", help="Table 3's shape (default base)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16", "int8"),
                        help="default: bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--beam", type=positive_int, default=4, help="1: greedy (default 4)")
    parser.add_argument("--cuda-graphs", action="store_true", help="each step one CUDA graph (a GPU only)")
    parser.add_argument("--sentences", type=positive_int, default=64, help="one batch of them (default 64, as speed.py)")
    parser.add_argument("--calls", type=positive_int, default=2, help="profiled calls, after one untimed (default 2)")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, help="the table's file (default results/profile-decode-...txt)")
    args = parse_args(parser)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = device_or_exit(args.device)
    if args.cuda_graphs and device.type != "cuda":
        sys.exit("profile_decode.py: --cuda-graphs needs --device cuda")
    args.precision = args.precision or decoding_precision(device)
    require_precision(args.precision, device=device)
    systems.use_model(args.model)
    gpu = device.type == "cuda"
    system = systems.build("aiayn", device, args.precision, args.threads, cuda_graphs=args.cuda_graphs)
    sources = systems.decode_sources(args.sentences)
    system.decode(sources, args.beam)  # the decoding copy, the graph's recording
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof, Timer(device) as timer:
        outputs = [system.decode(sources, args.beam) for _ in range(args.calls)]
    tokens = sum(systems.check_outputs(out, len(sources)) for out in outputs)
    total_us = timer.seconds * 1e6
    kind = f"cuda-{torch.cuda.get_device_name(device).replace(' ', '-')}" if gpu else cpu_kind()
    label = f"{args.precision}, beam {args.beam}{', CUDA graphs' if args.cuda_graphs else ''}, {args.sentences} sentences"
    lines = [f"# {command_line()}", f"# aiayn Transformer-{args.model} decoding, {label}, {kind}, {args.threads} threads: "
             f"{tokens / timer.seconds:,.0f} output tokens/s, {timer.seconds / args.calls * 1e3:.1f} ms a call "
             f"(under the profiler, over {args.calls} calls)"]
    averages = prof.key_averages()
    host = [e for e in averages if e.device_type == DeviceType.CPU and e.self_cpu_time_total > 0]
    if gpu:
        kernels = gpu_kernels(averages)
        lines += gpu_summary(averages, kernels, total_us, args.calls, "call")
        lines += table("kernel", kernels, lambda e: e.self_device_time_total, total_us, args.calls, 15)
    lines += table("host operator", host, lambda e: e.self_cpu_time_total, total_us, args.calls, 30)
    peaks = machine(device, args.threads)["matmul_peak_tflops"]  # measured now, the profile done (found in review: absent)
    lines.insert(2, f"# this machine's matmul peak: {', '.join(f'{p} {v:g} TFLOP/s' for p, v in peaks.items())}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or RESULTS / (f"profile-decode-{kind}-{args.model + '-' if args.model != 'base' else ''}"
                                 f"{args.precision}-beam{args.beam}{'-graphs' if args.cuda_graphs else ''}.txt")
    or_exit(lambda: atomic_text(out, text))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
