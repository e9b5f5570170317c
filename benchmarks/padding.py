"""How much of a batch is padding: the real share of the padded source and target tokens over
one epoch of the built-in corpus, as aiayn's batching (aiayn.batching.make_batches) cuts it at
each token budget (§5.1), and how many batches the epoch has.

    .venv/bin/python benchmarks/padding.py --out benchmarks/results/padding.json
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/padding.py    # an older checkout's batching

The sentence lengths are speed.py's (systems.corpus_lengths: bible-en-es under a joint
SentencePiece BPE of 8,000 pieces, with EOS / BOS). Nothing is timed: the shares depend on the
lengths and the batching alone, not on the machine. "weighted" is the share of a step's model
work (Transformer-base's matrix products) that real tokens get: every padded source and target
position goes through the layers, the pre-softmax projection runs on real target tokens only
(aiayn computes no logits for padding). Attention's own products, which grow with the lengths
squared, are left out.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import systems
from aiayn.batching import make_batches
from aiayn.config import PRESETS
from common import command_line, default_threads, machine, parse_args, positive_int, write_results

BUDGETS = (2000, 8000, 25000)


def epoch_shares(lengths: np.ndarray, budget: int) -> dict:
    """Real shares of one epoch's padded tokens (seed 0, epoch 0) at `budget` tokens a batch."""
    batches = make_batches(lengths, budget, seed=0, epoch=0)
    real = padded = np.zeros(2)  # (source, target) tokens
    for rows in batches:
        pairs = lengths[rows]  # (B, 2)
        real = real + pairs.sum(axis=0)
        padded = padded + len(rows) * pairs.max(axis=0)
    # A padded position costs the same on either side: per layer, a source position's
    # self-attention projections (4·d²), its FFN (2·d·d_ff) and its encoder-decoder keys and
    # values (2·d²); a target position's self-attention projections, its encoder-decoder queries
    # and output (2·d²) and its FFN. The pre-softmax projection (d·vocabulary) runs once, on real
    # target tokens only.
    base = PRESETS["base"]
    per_position = base.n_layers * (6 * base.d_model**2 + 2 * base.d_model * base.d_ff)
    output = base.d_model * systems.VOCAB / per_position  # a real target token's extra, in positions
    real_work = real.sum() + output * real[1]
    return {"batches": len(batches),
            "source": real[0] / padded[0], "target": real[1] / padded[1], "both": real.sum() / padded.sum(),
            "weighted": real_work / (padded.sum() + output * real[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=positive_int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--out", type=Path, help="result file (default: print only)")
    args = parse_args(parser)
    with tempfile.TemporaryDirectory() as scratch:
        lengths = systems.corpus_lengths(Path(scratch))
    rows = {budget: epoch_shares(lengths, budget) for budget in args.budgets}
    for budget, row in rows.items():
        print(f"{budget:>6,} tokens: {row['batches']:,} batches; real share of the padded source {row['source']:.3f}, "
              f"target {row['target']:.3f}, both {row['both']:.3f}, weighted {row['weighted']:.3f}")
    if args.out:
        import aiayn.batching

        write_results(args.out, {"benchmark": "padding", "command": command_line(),
                                 "machine": machine(torch.device("cpu"), default_threads()),  # as every result file (was absent)
                                 "pairs": len(lengths),
                                 "batching": str(Path(aiayn.batching.__file__).resolve()), "budgets": rows})


if __name__ == "__main__":
    main()
