"""What int8 weights cost in quality: BLEU of a trained model on the built-in test books
(bible-en-es), decoded in bf16 and in int8 (and fp32 for reference), with the share of output
tokens that int8 and bf16 agree on, position by position, and the time each took.

    .venv/bin/python benchmarks/int8_quality.py runs/demo              # beam 4, every test verse
    .venv/bin/python benchmarks/int8_quality.py runs/demo --sentences 500 --beam 1

Writes results/int8-quality-KIND.json (KIND: the CPU kind). The model is any run or model
folder trained on bible-en-es, e.g. the one `make demo` leaves in runs/demo.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from aiayn.run import resolve_model_dir
from aiayn.config import DecodeConfig
from aiayn.corpora import load_corpus
from aiayn.device import cpu_kind
from aiayn.evaluate import score_hypotheses
from aiayn.model import Transformer
from aiayn.tokenizer import has_tokenizer, load_tokenizer
from aiayn.translate import Translator
from common import (RESULTS, command_line, default_threads, machine, or_exit, parse_args, positive_int,
                    require_precision, write_results)

PRECISIONS = ("fp32", "bf16", "int8")


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of output positions (over the longer of each pair) where both hold the same token."""
    pairs = [(x, y) for u, v in zip(a, b) for x, y in zip(u + [None] * len(v), v + [None] * len(u))]
    return sum(x == y for x, y in pairs) / max(len(pairs), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run or model folder trained on bible-en-es")
    parser.add_argument("--beam", type=positive_int, default=4)
    parser.add_argument("--sentences", type=positive_int, default=None, help="only the first N test verses")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, default=None, help="result file (default results/int8-quality-KIND.json)")
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    torch.set_num_threads(args.threads)
    require_precision(*PRECISIONS)
    model_dir = or_exit(lambda: resolve_model_dir(args.run_dir))
    model = or_exit(lambda: Transformer.load(model_dir)).eval()
    tokenizer = or_exit(lambda: load_tokenizer(model_dir if has_tokenizer(model_dir) else Path(args.run_dir)))  # (a traceback before)
    test = load_corpus("bible-en-es").splits["test"][: args.sentences]
    outputs, rows = {}, []
    for precision in PRECISIONS:
        # the decoding copy is made once, outside the timing, as `aiayn translate` does
        translator = Translator(model, tokenizer, DecodeConfig(beam=args.beam, precision=precision))
        start = time.perf_counter()
        outputs[precision] = translator.translate_ids(tokenizer.encode_batch([s for s, _ in test]))
        result = score_hypotheses([tokenizer.decode(ids) for ids in outputs[precision]], [t for _, t in test],
                                  time.perf_counter() - start)
        rows.append({"precision": precision, "bleu": result.bleu, "seconds": result.seconds,
                     "output_tokens": sum(map(len, outputs[precision]))})
        print(f"{precision}: BLEU {result.bleu:.2f}, {result.seconds:.1f} s", flush=True)
    by = {r["precision"]: r for r in rows}
    results = {
        "benchmark": "int8-quality",
        "command": command_line(),
        "machine": machine(torch.device("cpu"), args.threads),
        "model": str(model_dir),
        "parameters": model.num_parameters(),
        "sentences": len(test),
        "beam": args.beam,
        "bleu_signature": result.signature,
        "rows": rows,
        "int8_minus_bf16_bleu": by["int8"]["bleu"] - by["bf16"]["bleu"],
        "int8_bf16_token_agreement": agreement(outputs["int8"], outputs["bf16"]),
        "bf16_fp32_token_agreement": agreement(outputs["bf16"], outputs["fp32"]),
    }
    print(f"int8 - bf16 BLEU {results['int8_minus_bf16_bleu']:+.2f}; token agreement int8/bf16 "
          f"{results['int8_bf16_token_agreement']:.3f}, bf16/fp32 {results['bf16_fp32_token_agreement']:.3f}")
    write_results(args.out or RESULTS / f"int8-quality-{cpu_kind()}.json", results)


if __name__ == "__main__":
    main()
