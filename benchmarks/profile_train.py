"""Where the time of one aiayn training step goes: torch.profiler over the steps that speed.py
times (Transformer-base, Adam; the fixed batch of 64 pairs of 32 + 32 tokens, or real batch
shapes of a token budget), grouped by operator.

    .venv/bin/python benchmarks/profile_train.py --precision bf16                 # autocast
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --bf16-weights  # bf16 weights, fp32 master
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --budget 2000   # speed.py's 2,000-token batches
    .venv/bin/python benchmarks/profile_train.py --precision bf16 --budget 2000 --compile  # the compiled step
    python benchmarks/profile_train.py --device cuda --model big --precision bf16 --budget 25000  # a GPU

With --compile the warm-up steps compile the step (TrainConfig.compile), and each kernel Inductor
generates is its own row (its cpp.enable_kernel_profile), so the table shows which fused kernels
take the time the matrix products leave.

On a CPU it also prints the process's page faults, its share of CPU time in the kernel and its
peak resident set, which say what the C heap costs (`GLIBC_TUNABLES=glibc.malloc.check=0` in the
environment times glibc's own malloc, without aiayn.device.keep_freed_memory).

Prints the operators that take the most self time on the CPU (on a GPU: the kernels that take
the most GPU time, and the share of the steps' wall time the GPU was busy), with their share of
the steps' wall time, and writes the table into results/profile-train-KIND-PRECISION.txt (KIND:
the CPU kind, or cuda-GPU NAME), or --out.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import systems
from aiayn.device import cpu_kind, keep_freed_memory, malloc_tuning
from aiayn.files import atomic_text
from common import (RESULTS, Timer, command_line, default_threads, device_or_exit, machine, matmul_precision, or_exit,
                    parse_args, positive_int, require_precision)


# What a GPU kernel computes, read from its name (cuBLAS, CUTLASS, PyTorch's attention kernels),
# the first kind that matches: attention before matrix products, since the names of PyTorch's
# attention kernels hold "cutlass" too (fmha_cutlassF_..., flash kernels templated on cutlass types).
KERNEL_KINDS = (("attention (fused)", ("flash", "fmha", "attention", "sdpa", "cudnn")),
                ("matrix products", ("gemm", "nvjet", "cutlass", "xmma", "splitk")),
                ("softmax / log-softmax", ("softmax",)),
                ("layer norm", ("layer_norm", "layernorm")),
                ("Adam", ("adam",)),
                ("reductions", ("reduce",)))

# The CUDA runtime calls in which the host waits for the GPU.
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def kernel_kinds(events: list, own) -> dict[str, float]:
    """GPU time (µs) by kind of kernel, the rest as element-wise and other."""
    totals: dict[str, float] = {}
    for event in events:
        name = event.key.lower()
        kind = next((k for k, marks in KERNEL_KINDS if any(m in name for m in marks)), "element-wise and other")
        totals[kind] = totals.get(kind, 0.0) + own(event)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def gpu_kernels(averages: list) -> list:
    """A GPU profile's kernels: not the CPU operators that launched them, nor a span annotated
    around some (the optimizer's step), which would count their time again."""
    return [e for e in averages if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0
            and not getattr(e, "is_user_annotation", False)]


def gpu_summary(averages: list, kernels: list, total_us: float, count: int, unit: str) -> list[str]:
    """The share of the wall time `total_us` the GPU's `kernels` were busy, their time by kind and
    the host's calls that may wait for the GPU, per `unit` (`count` of them profiled)."""
    own = lambda e: e.self_device_time_total  # noqa: E731
    lines = [f"# GPU kernels busy {sum(map(own, kernels)) / total_us:.1%} of the wall time (kernels of side streams "
             "may overlap)"]
    for kind_name, share in kernel_kinds(kernels, own).items():
        lines.append(f"#   {kind_name:<28} {share / count / 1e3:>8.2f} ms/{unit} {share / total_us:>7.1%}")
    # The host's calls that may wait for the GPU (a copy from pinned memory is only queued):
    # while the host waits it queues nothing, and the GPU idles once it has caught up.
    for event in averages:
        if event.key in HOST_WAITS:
            lines.append(f"# host in {event.key}: {event.self_cpu_time_total / count / 1e3:.2f} ms/{unit}, "
                         f"{event.count / count:.0f} calls/{unit}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--model", choices=systems.MODELS, default="base", help="Table 3's shape (default base)")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="bf16", help="tf32: a GPU's fp32 "
                        "with TF32 matrix products")
    parser.add_argument("--out", type=Path, help="the table's file (default results/profile-train-...txt)")
    parser.add_argument("--bf16-weights", action="store_true", help="bf16 weights with fp32 master weights")
    parser.add_argument("--compile", action="store_true", help="the compiled step, each generated kernel a row")
    parser.add_argument("--steps", type=positive_int, default=3, help="profiled steps, after 2 untimed ones (default 3)")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    batches = parser.add_mutually_exclusive_group()
    batches.add_argument("--rows", type=positive_int, default=64, help="the fixed batch: pairs of 32 + 32 tokens (default 64, as speed.py)")
    batches.add_argument("--budget", type=positive_int, help="real batch shapes of this token budget instead, one per profiled "
                         "step, as speed.py cuts them")
    args = parse_args(parser)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = device_or_exit(args.device)
    precision = matmul_precision(args.precision, device)
    require_precision(precision, device=device)
    systems.use_model(args.model)
    gpu = device.type == "cuda"
    if args.compile and not gpu:
        from torch._inductor import config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    system = systems.build("aiayn", device, precision, args.threads, compile=args.compile,
                           bf16_weights=args.bf16_weights)
    if args.budget:
        with tempfile.TemporaryDirectory() as scratch:
            shapes = systems.corpus_shapes(systems.corpus_lengths(Path(scratch)), args.budget, args.steps)
    else:
        shapes = [systems.fixed_shape(args.rows)] * args.steps
    batches = [systems.shaped_batch(shape, system.specials, systems.batch_device(system, device)) for shape in shapes]
    for batch in batches[:2]:
        system.train_step(*batch)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof, Timer(device) as timer:
        for batch in batches:
            system.train_step(*batch)
    seconds = timer.seconds
    tokens_per_s = systems.target_tokens(shapes) / seconds
    # The time that counts: the GPU's kernels on a GPU (the host only launches them), the
    # operators' own CPU time on a CPU.
    own = (lambda e: e.self_device_time_total) if gpu else (lambda e: e.self_cpu_time_total)
    events = gpu_kernels(prof.key_averages()) if gpu else [e for e in prof.key_averages() if own(e) > 0]
    events.sort(key=own, reverse=True)
    total_us = seconds * 1e6
    label = f"{args.precision}{' bf16 weights' if args.bf16_weights else ''}{' compiled' if args.compile else ''}" + \
        (f", {args.budget}-token batches" if args.budget else f", {args.rows} x 32 + 32")
    kind = f"cuda-{torch.cuda.get_device_name(device).replace(' ', '-')}" if gpu else cpu_kind()
    flops = systems.flops_per_token(shapes) * tokens_per_s
    lines = [f"# {command_line()}", f"# aiayn Transformer-{args.model} training, {label}, {kind}, {args.threads} threads: "
             f"{tokens_per_s:,.0f} target tokens/s, {flops / 1e12:.1f} model TFLOP/s, over {args.steps} profiled steps "
             f"({seconds:.2f} s)"]
    if gpu:
        lines += gpu_summary(prof.key_averages(), events, total_us, args.steps, "step")
    else:  # what the C heap costs: each page the kernel maps afresh is a fault, zeroed in kernel time
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tuned = malloc_tuning()
        heap = "kept (aiayn.device.keep_freed_memory)" if keep_freed_memory() else \
            f"the C library's own{f', tuned by {tuned}' if tuned else ''}"  # (asked again: what TrainStep set)
        lines.append(f"# the whole process (model, warm-up and profiled steps): {usage.ru_minflt / 1e6:.2f} million page "
                     f"faults, {usage.ru_stime / (usage.ru_stime + usage.ru_utime):.0%} of its CPU time in the kernel, "
                     f"peak resident {usage.ru_maxrss / 2**20:.1f} GiB; freed memory: {heap}")
    lines.append(f"{'kernel' if gpu else 'operator':<64} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for event in events[:40 if gpu else 25]:
        per_step = own(event) / args.steps / 1e3
        lines.append(f"{event.key[:64]:<64} {per_step:>12.2f} {own(event) / total_us:>7.1%} {event.count / args.steps:>10.0f}")
    peaks = machine(device, args.threads)["matmul_peak_tflops"]  # measured now, the profile done (found in review: absent)
    lines.insert(2, f"# this machine's matmul peak: {', '.join(f'{p} {v:g} TFLOP/s' for p, v in peaks.items())}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or RESULTS / (f"profile-train-{kind}-{args.model + '-' if args.model != 'base' else ''}{args.precision}"
                                 f"{'-bf16-weights' if args.bf16_weights else ''}{'-compiled' if args.compile else ''}"
                                 f"{f'-{args.budget}' if args.budget else ''}.txt")
    or_exit(lambda: atomic_text(out, text))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
