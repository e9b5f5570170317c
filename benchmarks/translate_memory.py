"""Peak memory of `aiayn translate` against the length of its input: the streaming check.

`aiayn translate` reads, decodes and writes 1,000 lines at a time, so its peak resident memory
should not grow with the file. This command makes a small random model with a real tokenizer
(nothing is downloaded), writes inputs of --lines lines, and runs `aiayn translate` on each in a
fresh process, --reps times in interleaved order. The child reports its own peak resident set
(VmHWM). Writes results/translate-memory-KIND.json (KIND: the CPU kind, aiayn.device.cpu_kind); the docs quote the medians.

    python benchmarks/translate_memory.py                    # 2,000 and 20,000 lines, 3 reps
    python benchmarks/translate_memory.py --lines 1000 100000 --reps 1
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from aiayn.config import ModelConfig
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer
from common import RESULTS, command_line, cpu_kind, default_threads, machine, parse_args, positive_int, spread, write_results

WORDS = "the a small big red blue cat dog bird fish sees likes eats finds near under over with river".split()

# Run in the child: translate, then print the peak resident set of this very process.
CHILD = """
import sys
from pathlib import Path
from aiayn.cli import main
main(sys.argv[1:])
for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
        print("PEAK_MIB", int(line.split()[1]) / 1024)
"""


def make_model(folder: Path) -> None:
    """A 1-layer model of width 64 with a 300-piece SentencePiece tokenizer."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(500)]
    tokenizer = Tokenizer.train(sentences, 300, folder)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_heads=4, d_ff=128, n_layers=1, dropout=0.0)
    Transformer(config).save(folder)


def write_input(path: Path, lines: int) -> None:
    rng = random.Random(lines)
    path.write_text("".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 20))) + "\n" for _ in range(lines)))


def peak_mib(model: Path, source: Path, output: Path) -> float:
    argv = ["translate", str(model), "--input", str(source), "--output", str(output), "--beam", "1", "--force"]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"aiayn translate failed: {done.stderr.strip()[-500:]}")
    return float(done.stdout.split("PEAK_MIB")[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=positive_int, nargs="+", default=[2000, 20000], help="input sizes, in lines")
    parser.add_argument("--reps", type=positive_int, default=3, help="repetitions of every size, interleaved")
    parser.add_argument("--out", type=Path, help="result file (default results/translate-memory-KIND.json)")
    args = parse_args(parser)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_model(tmp / "model")
        for lines in args.lines:
            write_input(tmp / f"{lines}.txt", lines)
        peaks: dict[int, list[float]] = {lines: [] for lines in args.lines}
        for rep in range(args.reps):
            for lines in args.lines:
                peaks[lines].append(peak_mib(tmp / "model", tmp / f"{lines}.txt", tmp / "out.txt"))
                print(f"rep {rep + 1}: {lines:,} lines, peak {peaks[lines][-1]:.0f} MiB", flush=True)
    results = {
        "command": command_line(),
        "machine": machine(torch.device("cpu"), default_threads()),
        "what": "peak resident set (VmHWM, MiB) of `aiayn translate --beam 1` on N-line inputs, tiny random model",
        "peak_mib": {str(lines): spread(values) for lines, values in peaks.items()},
        "runs": {str(lines): values for lines, values in peaks.items()},
    }
    write_results(args.out or RESULTS / f"translate-memory-{cpu_kind()}.json", results)
    print(json.dumps(results["peak_mib"], indent=1))


if __name__ == "__main__":
    main()
