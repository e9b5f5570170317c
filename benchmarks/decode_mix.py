"""aiayn's decoding of sentences of many lengths, as `aiayn translate` meets a file, with CUDA
graphs (`DecodeConfig.cuda_graphs`) and without, interleaved in one process.

speed.py decodes 64 sentences of one length: one batch, one shape, so the graph is recorded once
and replayed by every timed call. A file's sentences are sorted by length and packed into batches
of `batch_tokens`, nearly every one of another shape (sentences, source width, output limit),
and each new shape records a new graph before it replays it. This measures whether the graphs
still win there: random ids at the source lengths of the built-in corpus under speed.py's
tokenizer, Transformer-base with random weights, each output as long as its source
(`extra_len` 0: a random model rarely ends earlier).

    python benchmarks/decode_mix.py --device cuda --precision bf16      # -> results/decode-mix-cuda-GPU-bf16-beam4.json
    .venv/bin/python benchmarks/decode_mix.py --sentences 64 --reps 1   # a CPU: the graphs are off there, a smoke test
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import systems
from aiayn.config import DecodeConfig
from aiayn.device import cpu_kind
from aiayn.model import Transformer
from aiayn.translate import Translator
from common import (RESULTS, Timer, command_line, decoding_precision, default_threads, device_or_exit, machine,
                    parse_args, positive_int, require_precision, spread, write_results)


def mix_sources(count: int, seed: int = 1) -> list[list[int]]:
    """`count` sources (ids without EOS) at source lengths drawn from the built-in corpus."""
    with tempfile.TemporaryDirectory() as scratch:
        lengths = systems.corpus_lengths(Path(scratch))[:, 0] - 1  # (N,) without EOS
    generator = torch.Generator().manual_seed(seed)
    picked = np.random.default_rng(seed).choice(lengths, size=count)
    return [systems.content_ids(1, int(length), generator)[0].tolist() for length in picked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--model", choices=systems.MODELS, default="base", help="Table 3's shape (default base)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="default: bf16 on a GPU, fp32 on a CPU")
    parser.add_argument("--beam", type=positive_int, default=4, help="1: greedy (default 4)")
    parser.add_argument("--sentences", type=positive_int, default=1000, help="sources, drawn at the corpus' lengths (default 1000)")
    parser.add_argument("--batch-tokens", type=positive_int, default=DecodeConfig().batch_tokens,
                        help="source tokens a batch, as `aiayn translate --batch-tokens` (default its default)")
    parser.add_argument("--reps", type=positive_int, default=3, help="interleaved passes of each (default 3), after one untimed")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, help="result file (default results/decode-mix-KIND-PRECISION-beamK.json)")
    args = parse_args(parser)
    torch.set_num_threads(args.threads)
    device = device_or_exit(args.device)
    precision = args.precision or decoding_precision(device)
    require_precision(precision, device=device)
    systems.use_model(args.model)
    torch.manual_seed(0)
    model = Transformer(systems.CONFIG).to(device).eval()
    translator = Translator(model, None, DecodeConfig(precision=precision, beam=args.beam,
                                                      batch_tokens=args.batch_tokens, extra_len=0))
    sources = mix_sources(args.sentences)
    variants = {"without graphs": False, "CUDA graphs": True}
    outputs, seconds = {}, {name: [] for name in variants}
    for rep in range(args.reps + 1):  # the first pass warms the kernels and the allocator, untimed
        for name, graphs in variants.items():
            with Timer(device) as timer:
                outputs[name] = translator.translate_ids(sources, cuda_graphs=graphs)
            if rep:
                seconds[name].append(timer.seconds)
                print(f"[{rep}/{args.reps}] {name}: {timer.seconds:.3f} s", flush=True)
    tokens = {name: sum(len(out) for out in outs) for name, outs in outputs.items()}
    same = sum(a == b for a, b in zip(*outputs.values())) / len(sources)
    rates = {name: spread([tokens[name] / s for s in times]) for name, times in seconds.items()}
    kind = f"cuda-{torch.cuda.get_device_name(device).replace(' ', '-')}" if device.type == "cuda" else cpu_kind()
    results = {
        "benchmark": "decode_mix", "command": command_line(), "machine": machine(device, args.threads),
        "settings": {"model": args.model, "precision": precision, "beam": args.beam, "sentences": args.sentences,
                     "source_tokens": sum(map(len, sources)), "batch_tokens": args.batch_tokens, "reps": args.reps},
        "output_tokens": tokens, "tokens_per_s": rates, "seconds": seconds,
        "graphs_over_without": rates["CUDA graphs"]["median"] / rates["without graphs"]["median"],
        "same_outputs": same,
    }
    for name, rate in rates.items():
        print(f"{name}: {rate['median']:,.0f} output tokens/s ({rate['min']:,.0f}–{rate['max']:,.0f})")
    print(f"graphs over without: {results['graphs_over_without']:.2f}×; the same output for {same:.1%} of the sentences")
    write_results(args.out or RESULTS / f"decode-mix-{kind}-{precision}-beam{args.beam}.json", results)


if __name__ == "__main__":
    main()
