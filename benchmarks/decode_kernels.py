"""The measurements behind aiayn.kernels' choices for decoding on a CPU, at Transformer-base's
shapes (d_model 512, 8 heads of 64, d_ff 2048, vocabulary 8,000) with 256 rows (64 sentences ×
beam 4), 64 rows (greedy) and 4 rows (one sentence, beam 4: a server answering one request):

    linear     y = xWᵀ + b in fp32, bf16, int8 weights with dynamic int8 activations (FBGEMM,
               aiayn.inference.Int8Linear: what `--precision int8` uses) and int8 weights with bf16 activations
               (torch._weight_int8pack_mm, weight-only); and fp32 and bf16 with the weight packed
               once for oneDNN (aiayn.inference.PackedLinear, what `--precision fp32` and `bf16`
               use on a CPU: rows padded to aiayn.inference.padded_rows)
    kept       the memory a process keeps after computing the 512 -> 2,048 layer at each row
               count from 1 to --kept-rows, by F.linear in fp32 (and bf16), int8 dynamic, and
               the packed weight with the rows padded (as aiayn runs it) and not padded: oneDNN
               makes and keeps a kernel for every row count it meets, and decoding meets many
               (each beam, batch and step differs). This is why aiayn pads the rows.
    attention  one decoding step's attention, the fused kernel against two matrix products:
               self-attention (1 query per row against 17 cached positions) and the beams of a
               sentence against its memory (4 queries against 32 source positions); and a whole
               sequence (32 and 128 queries), where the fused kernel should win
    cache      the beams' reorder of one layer's cached keys (16 sentences × beam 4, 43 columns
               written): every row gathered into the other buffer, as aiayn.cache does, against
               only the quarter of the rows whose parent is another beam's, gathered and written
               back in place (`index_copy_`); and a step's keys product over those 43 columns
               when they are the whole buffer, against the same columns of a buffer with room for
               100 (what an in-place cache would attend to)

bf16 cases only where the CPU computes bf16 in hardware (aiayn.device.fast_bf16).

Each timing is the median of --reps interleaved repetitions of --calls calls. The memory kept is
the growth of the resident set (Linux /proc), each way in a fresh process.

    .venv/bin/python benchmarks/decode_kernels.py          # about 1 minute -> results/decode-kernels-KIND.json
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from aiayn.device import cpu_kind, fast_bf16
from aiayn.inference import PackedLinear, inference_copy, packed_product
from aiayn.kernels import fused_attention, matmul_attention
from common import RESULTS, command_line, default_threads, machine, parse_args, positive_int, spread, write_results

D_MODEL, HEADS, D_HEAD, D_FF, VOCAB = 512, 8, 64, 2048, 8000


def linear_cases(rows: int, bf16: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a call, for each weight shape of the decoder and each way of computing it."""
    cases = {}
    for out_features, in_features in ((D_MODEL, D_MODEL), (D_FF, D_MODEL), (D_MODEL, D_FF), (VOCAB, D_MODEL)):
        layer = torch.nn.Linear(in_features, out_features).eval()
        x = torch.randn(rows, in_features)
        dynamic = inference_copy(torch.nn.Sequential(layer), "int8")  # what `--precision int8` runs
        w, b = layer.weight.detach(), layer.bias.detach()
        scale = w.abs().amax(1) / 127
        w8 = (w / scale[:, None]).round().to(torch.int8)
        wb, bb, xb = w.bfloat16(), b.bfloat16(), x.bfloat16()
        shape = f"{rows}x{in_features}->{out_features}"
        cases[f"linear {shape} fp32"] = lambda x=x, w=w, b=b: F.linear(x, w, b)
        cases[f"linear {shape} fp32 packed (oneDNN)"] = packed_linear(x, layer)
        cases[f"linear {shape} int8 dynamic"] = lambda x=x, m=dynamic: m(x)
        if bf16:
            cases[f"linear {shape} bf16"] = lambda x=xb, w=wb, b=bb: F.linear(x, w, b)
            cases[f"linear {shape} bf16 packed (oneDNN)"] = packed_linear(xb, copy.deepcopy(layer).bfloat16())
            cases[f"linear {shape} int8 weight-only bf16"] = lambda x=xb, w=w8, s=scale.bfloat16(): torch._weight_int8pack_mm(x, w, s)
    return cases


class Unpadded(PackedLinear):
    """aiayn.inference.PackedLinear without the padding of its rows: a kernel for every row count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (rows, in_features) -> (rows, out_features)
        return packed_product(x, self.packed, self.bias)


def packed_linear(x: torch.Tensor, layer: torch.nn.Linear) -> Callable[[], torch.Tensor]:
    """`layer`(x) with the weight packed, checked against the layer itself."""
    packed = PackedLinear(layer.weight, layer.bias)
    torch.testing.assert_close(packed(x), layer(x), atol=1e-2 if x.dtype == torch.bfloat16 else 1e-5, rtol=1e-2)
    return lambda: packed(x)


def resident_mib() -> float:
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    return int(status["VmRSS"].split()[0]) / 1024


KEPT_WAYS = ("fp32 F.linear", "fp32 packed", "fp32 packed, rows not padded", "int8 dynamic", "bf16 F.linear",
             "bf16 packed")


def kept_mib(way: str, rows: int) -> dict:
    """In this process: the resident set's growth over two passes of the 512 -> 2,048 layer at
    every row count from 1 to `rows` (the second pass: what the first left for good is reused)."""
    layer = torch.nn.Linear(D_MODEL, D_FF).eval()
    dtype = torch.bfloat16 if way.startswith("bf16") else torch.float32
    low = layer.bfloat16() if way.startswith("bf16") else layer
    call = {"fp32 F.linear": lambda: layer, "fp32 packed": lambda: PackedLinear(layer.weight, layer.bias),
            "fp32 packed, rows not padded": lambda: Unpadded(layer.weight, layer.bias), "bf16 F.linear": lambda: low,
            "bf16 packed": lambda: PackedLinear(low.weight, low.bias),
            "int8 dynamic": lambda: inference_copy(torch.nn.Sequential(layer), "int8")}[way]()
    start, passes = resident_mib(), []
    with torch.inference_mode():
        for _ in range(2):
            for n in range(1, rows + 1):
                call(torch.randn(n, D_MODEL, dtype=dtype))
            passes.append(round(resident_mib() - start, 1))
    return {"way": way, "row_counts": rows, "kept_mib_after_each_pass": passes}


def kept_cases(rows: int, threads: int, bf16: bool) -> list[dict]:
    """kept_mib of each way, each in a fresh process."""
    results = []
    for way in (way for way in KEPT_WAYS if bf16 or not way.startswith("bf16")):
        out = subprocess.run([sys.executable, __file__, "--kept-child", way, "--kept-rows", str(rows),
                              "--threads", str(threads)], check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.splitlines()[-1]))
    return results


def attention_cases(bf16: bool) -> dict[str, Callable[[], torch.Tensor]]:
    cases = {}
    generator = torch.Generator().manual_seed(0)
    shapes = {  # name: (rows, queries, keys, causal)
        "decoding self-attention, 1 query vs 17 cached": (256, 1, 17, True),
        "decoding cross-attention, 4 beams vs 32 source": (64, 4, 32, False),
        "encoder self-attention, 32 vs 32": (64, 32, 32, False),
        "encoder self-attention, 128 vs 128": (64, 128, 128, False),
    }
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))[: 2 if bf16 else 1]:
        for name, (rows, queries, keys, causal) in shapes.items():
            q = torch.randn(rows, HEADS, queries, D_HEAD, generator=generator).to(dtype)
            k = torch.randn(rows, HEADS, keys, D_HEAD, generator=generator).to(dtype)
            v = torch.randn(rows, HEADS, keys, D_HEAD, generator=generator).to(dtype)
            mask = None if causal else torch.ones(rows, 1, 1, keys, dtype=torch.bool)
            for kernel in (fused_attention, matmul_attention):
                cases[f"attention {name} {label} {kernel.__name__}"] = (
                    lambda q=q, k=k, v=v, m=mask, c=causal, f=kernel: f(q, k, v, m, c, 0.0))
    return cases


def cache_cases(bf16: bool) -> dict[str, Callable[[], torch.Tensor]]:
    cases = {}
    rows, written, room = 64, 43, 100
    parents = torch.arange(rows).view(-1, 4)[:, [0, 0, 1, 2]].flatten()  # each sentence's first beam had two children
    moved = torch.arange(1, rows, 4)  # the rows whose parent is another row: a quarter
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))[: 2 if bf16 else 1]:
        keys = torch.randn(rows, HEADS, room, D_HEAD).to(dtype)
        spare = torch.empty(rows, HEADS, written + 1, D_HEAD, dtype=dtype)  # room for the next column
        taken = torch.empty(moved.numel(), HEADS, written, D_HEAD, dtype=dtype)
        cases[f"cache reorder {label}, every row into the other buffer"] = (
            lambda k=keys, s=spare: torch.index_select(k[:, :, :written], 0, parents, out=s[:, :, :written]))
        cases[f"cache reorder {label}, the moved quarter in place"] = (
            lambda k=keys[:, :, :written], t=taken: k.index_copy_(0, moved, torch.index_select(k, 0, parents[moved], out=t)))
        q = torch.randn(rows * HEADS, 1, D_HEAD).to(dtype)
        whole = torch.randn(rows * HEADS, written, D_HEAD).to(dtype)
        cases[f"cache keys product {label}, the whole buffer"] = lambda q=q, k=whole: q @ k.transpose(1, 2)
        cases[f"cache keys product {label}, in a buffer with room"] = (
            lambda q=q, k=keys.view(rows * HEADS, room, D_HEAD)[:, :written]: q @ k.transpose(1, 2))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--calls", type=positive_int, default=20)
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--kept-rows", type=positive_int, default=200, help="row counts of the memory case (default 200)")
    parser.add_argument("--kept-child", choices=KEPT_WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="the results file (default results/decode-kernels-KIND.json)")
    args = parse_args(parser)
    torch.set_num_threads(args.threads)
    if args.kept_child:
        print(json.dumps(kept_mib(args.kept_child, args.kept_rows)))
        return
    bf16 = fast_bf16(torch.device("cpu"))
    cases = {**linear_cases(256, bf16), **linear_cases(64, bf16), **linear_cases(4, bf16), **attention_cases(bf16),
             **cache_cases(bf16)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    with torch.inference_mode():
        for call in cases.values():  # warm-up: packing, first-touch, oneDNN primitives
            call()
        for _ in range(args.reps):
            for name, call in cases.items():
                start = time.perf_counter()
                for _ in range(args.calls):
                    call()
                times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    rows = [{"case": name, "ms": spread(values)} for name, values in times.items()]
    for row in rows:
        print(f"{row['case']:75s} {row['ms']['median']:8.3f} ms")
    kept = kept_cases(args.kept_rows, args.threads, bf16)
    for row in kept:
        print(f"kept after {row['row_counts']} row counts, {row['way']:13s}: {row['kept_mib_after_each_pass']} MiB")
    write_results(args.out or RESULTS / f"decode-kernels-{cpu_kind()}.json", {
        "benchmark": "decode-kernels", "command": command_line(),
        "machine": machine(torch.device("cpu"), args.threads), "reps": args.reps, "calls": args.calls, "rows": rows,
        "kept": kept,
    })


if __name__ == "__main__":
    main()
