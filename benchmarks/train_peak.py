"""The peak resident set of `aiayn train` against `aiayn.flops.training_peak_bytes`, the estimate
that warns a run before it starts that it may not fit in memory.

    .venv/bin/python benchmarks/train_peak.py        # ~4 minutes on a 2-core CPU -> results/train-peak-KIND.json

Each case trains 3 steps of bible-en-es in fp32 in a fresh process (benchmarks/peak_rss_child.py
reads its VmHWM): the small preset at two batch sizes, then with twice the layers and twice the
vocabulary, and base (vocabulary 8,000) at two batch sizes, so that the slopes of the estimate,
per token, per layer and per word of the vocabulary, each meet a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from aiayn.config import PRESETS
from aiayn.flops import training_peak_bytes
from common import RESULTS, command_line, cpu_kind, default_threads, machine, parse_args, write_results

CHILD = Path(__file__).resolve().parent / "peak_rss_child.py"
# (name, preset, --max-tokens, model options)
CASES = [("small", "small", 2000, {}), ("small", "small", 8000, {}), ("small, 6 layers", "small", 8000, {"n_layers": 6}),
         ("small, vocabulary 16,000", "small", 8000, {"vocab_size": 16000}),
         ("base, vocabulary 8,000", "base", 2000, {"vocab_size": 8000}),
         ("base, vocabulary 8,000", "base", 6000, {"vocab_size": 8000})]


def peak_mib(preset: str, max_tokens: int, changes: dict, folder: Path) -> float:
    """The peak resident set of 3 fp32 training steps in a fresh process."""
    options = [arg for name, value in changes.items() for arg in (f"--{name.replace('_', '-')}", str(value))]
    argv = [sys.executable, str(CHILD), "train", "--preset", preset, "--out", str(folder), "--max-tokens",
            str(max_tokens), "--max-steps", "3", "--eval-every", "100000", "--save-every", "100000",
            "--precision", "fp32", "--device", "cpu", *options]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return float(next(line.split()[2] for line in done.stdout.splitlines() if line.startswith("PEAK_MIB")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="default: results/train-peak-KIND.json")
    args = parse_args(parser)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, (name, preset, max_tokens, changes) in enumerate(CASES):
            config = dataclasses.replace(PRESETS[preset], **changes)
            measured = peak_mib(preset, max_tokens, changes, Path(scratch) / str(number))
            estimate = training_peak_bytes(config, max_tokens) / 2**20
            rows.append({"case": name, "max_tokens": max_tokens, "peak_mib": measured, "estimate_mib": estimate,
                         "estimate_over_peak": estimate / measured})
            print(f"{name}, --max-tokens {max_tokens}: peak {measured:,.0f} MiB, estimate {estimate:,.0f} MiB "
                  f"({estimate / measured:.2f}x)", flush=True)
    write_results(args.out or RESULTS / f"train-peak-{cpu_kind()}.json",
                  {"benchmark": "train-peak", "command": command_line(),
                   "machine": machine(torch.device("cpu"), default_threads()), "rows": rows})


if __name__ == "__main__":
    main()
