"""One measurement in a fresh process, printed as one JSON line on stdout.

speed.py and sweep.py run this once per case and repetition, so that no measurement inherits
another's memory peak, allocator state or warmed-up caches. Subcommands:

    train   tokens/s, achieved FLOP/s and peak memory of training steps of one system, on the
            fixed batch or on real batch shapes
    decode  output tokens/s and peak memory of decoding the same sentences with one system
    peak    the matmul FLOP/s roof (aiayn.device.matmul_peak_flops)
    layer   time and memory of one encoder layer forward + backward (the sequence-length sweep)
    convert save the Marian model and convert it for CTranslate2 (no measurement)

--model picks Table 3's base or big shape for every system; precision tf32 (a CUDA GPU only) is
fp32 with TF32 matrix products, which PyTorch leaves off by default (common.matmul_precision).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import systems
from aiayn.device import autocast, matmul_peak_flops, resolve_device
from common import Timer, matmul_precision, memory_mib, peak_memory_mib


def train(args, device: torch.device) -> dict:
    start_mib = memory_mib(device)
    system = systems.build(args.system, device, args.precision, args.threads, compile=args.compile,
                           bf16_weights=args.bf16_weights)
    if args.shapes:  # real batch shapes: each timed once, the first `warmup` of them also before
        shapes = json.loads(Path(args.shapes).read_text())
        batches = [systems.shaped_batch(shape, system.specials, systems.batch_device(system, device))
                   for shape in shapes]
    else:  # the fixed batch, `steps` times
        shapes = [systems.fixed_shape(args.rows)] * args.steps
        batches = [systems.shaped_batch(shapes[0], system.specials, systems.batch_device(system, device))] * args.steps
    for i in range(args.warmup):
        system.train_step(*batches[i % len(batches)])
    with Timer(device) as timer:
        for batch in batches:
            system.train_step(*batch)
    tokens = systems.target_tokens(shapes)  # real target tokens, the unit of the paper's batches
    compiled = {"compiles": system.step.compiles, "compile_s": system.step.compile_seconds} if args.compile else {}
    return {
        "tokens_per_s": tokens / timer.seconds, "seconds": timer.seconds,
        "tflops": systems.training_tflops(tokens / timer.seconds, shapes),  # the same model FLOPs for every system
        "peak_mib": peak_memory_mib(device), "start_mib": start_mib,
        "parameters": sum(p.numel() for p in system.model.parameters()),  # evidence of the common shape
        **compiled,  # graphs compiled (warm-up and timed steps) and the seconds of the steps that compiled them
    }


def decode(args, device: torch.device) -> dict:
    start_mib = memory_mib(device)
    ct2_dir = Path(args.ct2_dir) if args.ct2_dir else None
    system = systems.build(args.system, device, args.precision, args.threads, ct2_dir, cuda_graphs=args.cuda_graphs)
    sources = systems.decode_sources(args.sentences)
    for _ in range(args.warmup):
        system.decode(sources, args.beam)
    with Timer(device) as timer:
        outputs = [system.decode(sources, args.beam) for _ in range(args.calls)]
    tokens = sum(systems.check_outputs(out, len(sources)) for out in outputs)
    # CTranslate2 allocates outside torch, so on a GPU its memory is not seen.
    unseen = args.system == "ctranslate2" and device.type == "cuda"
    return {
        "tokens_per_s": tokens / timer.seconds, "seconds": timer.seconds,
        "peak_mib": None if unseen else peak_memory_mib(device), "start_mib": start_mib,
    }


def peak(args, device: torch.device) -> dict:
    return {"tflops": matmul_peak_flops(device, args.precision) / 1e12}


def layer(args, device: torch.device) -> dict:
    module = systems.encoder_layer(args.neighborhood, device)
    x = torch.randn(1, args.n, systems.CONFIG.d_model, device=device, requires_grad=True)
    grad = torch.randn(1, args.n, systems.CONFIG.d_model, device=device)
    start_mib = memory_mib(device)
    times = []
    for i in range(args.warmup + args.reps):
        with Timer(device) as timer:
            with autocast(device, args.precision):
                out, _ = module(x, None)  # (1, n, d_model), attention weights not asked for
            out.backward(grad.to(out.dtype))
        module.zero_grad(set_to_none=True)
        x.grad = None
        if i >= args.warmup:
            times.append(timer.seconds)
    peak_mib = peak_memory_mib(device)
    return {"times": times, "peak_mib": peak_mib, "start_mib": start_mib, "working_mib": peak_mib - start_mib}


def convert(args, device: torch.device) -> dict:
    folders = systems.convert_for_ctranslate2(Path(args.out), tuple(args.quantizations))
    return {q: str(path) for q, path in folders.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the weights")
    parser.add_argument("--model", choices=systems.MODELS, default="base", help="Table 3's shape for every system")
    tasks = parser.add_subparsers(dest="task", required=True)

    p = tasks.add_parser("train")
    p.add_argument("--system", choices=systems.TRAINABLE, required=True)
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), required=True)
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--rows", type=int, help="the fixed batch: this many pairs of 32 + 32 tokens")
    shape.add_argument("--shapes", help="a JSON list of batch shapes (systems.Shape), each timed once")
    p.add_argument("--warmup", type=int, required=True, help="untimed steps first")
    p.add_argument("--steps", type=int, help="timed steps of the fixed batch")
    p.add_argument("--compile", action="store_true", help="torch.compile (aiayn only)")
    p.add_argument("--bf16-weights", action="store_true", help="bf16 weights, fp32 master (aiayn only)")

    p = tasks.add_parser("decode")
    p.add_argument("--system", choices=systems.SYSTEMS, required=True)
    p.add_argument("--precision", choices=systems.DECODE_PRECISIONS, required=True)
    p.add_argument("--beam", type=int, required=True)
    p.add_argument("--sentences", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True, help="untimed calls over all sentences")
    p.add_argument("--calls", type=int, required=True, help="timed calls over all sentences")
    p.add_argument("--ct2-dir", help="the converted model (ctranslate2 only)")
    p.add_argument("--cuda-graphs", action="store_true", help="each decoding step one CUDA graph (aiayn only)")

    p = tasks.add_parser("peak")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), required=True)

    p = tasks.add_parser("layer")
    p.add_argument("--n", type=int, required=True, help="sequence length")
    p.add_argument("--neighborhood", type=int, help="restricted self-attention of size r; default: full")
    p.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--reps", type=int, required=True)

    p = tasks.add_parser("convert")
    p.add_argument("--out", required=True, help="scratch folder for the saved and converted models")
    p.add_argument("--quantizations", nargs="+", required=True, help="CTranslate2 types: float32, int8, ...")

    args = parser.parse_args()
    if args.task == "train" and args.rows and not args.steps:
        parser.error("--rows needs --steps")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    systems.use_model(args.model)
    if hasattr(args, "precision"):
        args.precision = matmul_precision(args.precision, device)
    task = {"train": train, "decode": decode, "peak": peak, "layer": layer, "convert": convert}[args.task]
    print(json.dumps(task(args, device)))


if __name__ == "__main__":
    main()
