"""This checkout of aiayn against another, side by side: is a change free of speed regressions?

Runs speed.py's aiayn cases (one_case.py, each in a fresh process) from two checkouts in turn,
repetition after repetition (this, other, this, other, ...), so that the machine's drift falls
on both alike, and reports each case's median and range and the ratio this / other:

    train   fp32 and bf16: target tokens/s of Adam steps on 64 pairs of 32 + 32 tokens, and
            (only when named in --cases) on speed.py's real batch shapes of 2,000 and 25,000
            tokens, each checkout's own batching cutting them from the same sentence lengths,
            eager or compiled ("... compiled": TrainConfig.compile, compiling in the warm-up)
    decode  fp32 (beam 4 and greedy), bf16 and int8 (beam 4): output tokens/s of 64 sentences
            of 32 tokens; fp32 and int8 at beam 4, and fp32 greedy, also of one sentence at a time
    demo    (only when named in --cases) `aiayn train` of the demo's model and recipe
            (`--recipe fast` in bf16, as each checkout's own fast recipe has it) on
            bible-en-es: the target tokens/s its log reports over steps 51-100
    translate command  (only when named in --cases) `aiayn translate` of 3 test verses with the
            demo's model (untrained weights, the demo's tokenizer), start to finish: lines/s
            over the whole process, its start-up and the model's loading included

Make the other checkout with git, e.g. `git worktree add /tmp/before HEAD~3`; each side imports
the aiayn of its own checkout (PYTHONPATH) with this environment's packages.

    python benchmarks/revisions.py --other /tmp/before --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy
import torch

import learning_curve
import speed
import systems
from aiayn.device import fast_bf16, matmul_peak_flops
from common import (command_line, cpu_kind, default_threads, machine, parse_args, positive_int, require_precision,
                    revision, spread, write_results)
from peers.harness import thread_env

HERE = Path(__file__).resolve().parent
CASES = {  # label: one_case.py arguments after the common ones
    "train fp32": ["train", "--system", "aiayn", "--precision", "fp32", "--rows", "64", "--warmup", "2", "--steps", "5"],
    "train bf16": ["train", "--system", "aiayn", "--precision", "bf16", "--rows", "64", "--warmup", "2", "--steps", "5"],
    "decode fp32 beam 4": ["decode", "--system", "aiayn", "--precision", "fp32", "--beam", "4", "--sentences", "64",
                           "--warmup", "1", "--calls", "1"],
    "decode fp32 greedy": ["decode", "--system", "aiayn", "--precision", "fp32", "--beam", "1", "--sentences", "64",
                           "--warmup", "1", "--calls", "1"],
    "decode bf16 beam 4": ["decode", "--system", "aiayn", "--precision", "bf16", "--beam", "4", "--sentences", "64",
                           "--warmup", "1", "--calls", "1"],
    "decode int8 beam 4": ["decode", "--system", "aiayn", "--precision", "int8", "--beam", "4", "--sentences", "64",
                           "--warmup", "1", "--calls", "1"],
    # one sentence at a time, as a server answers a lone client: each step's fixed costs
    "decode fp32 beam 4 one sentence": ["decode", "--system", "aiayn", "--precision", "fp32", "--beam", "4",
                                        "--sentences", "1", "--warmup", "2", "--calls", "8"],
    "decode int8 beam 4 one sentence": ["decode", "--system", "aiayn", "--precision", "int8", "--beam", "4",
                                        "--sentences", "1", "--warmup", "2", "--calls", "8"],
    "decode fp32 greedy one sentence": ["decode", "--system", "aiayn", "--precision", "fp32", "--beam", "1",
                                        "--sentences", "1", "--warmup", "2", "--calls", "8"],
}
# speed.py's real batch shapes: (precision, budget, warm-up steps, timed batches, compiled); each
# checkout's own batching cuts them from the same sentence lengths (the same shapes wherever the
# batching is unchanged), so a change of the batching is measured as what a run of that checkout
# trains on. The compiled cases compile in their warm-up steps, untimed.
BUDGETS = {f"train {precision} {budget}-token batches{' compiled' if compiled else ''}":
           (precision, budget, warmup, count, compiled)
           for budget, warmup, count in speed.FULL.budgets for precision in speed.PRECISIONS
           if precision != "tf32"  # a GPU's: every case here runs on the CPU (found in a misuse hunt: refused mid-run)
           for compiled in (False, True)}
DEMO = "demo train bf16"  # the whole trainer, `aiayn train`: its loop, data path and memory handling too
DEMO_STEPS = 100  # the demo case's steps; the first half (start-up, warm-up of the allocator) is not timed
TRANSLATE = "translate command"  # what a user waits for from the command line, start-up included
TRANSLATE_LINES = 3


def translate_inputs(scratch: Path, data: Path) -> tuple[Path, Path]:
    """A model folder of the demo's shape (untrained, this checkout's format) with the tokenizer
    of `data`, and a file of the first test verses."""
    from aiayn.config import demo_model
    from aiayn.corpora import load_corpus
    from aiayn.model import Transformer
    from aiayn.tokenizer import Tokenizer

    model = scratch / "translate-model"
    torch.manual_seed(0)
    Transformer(demo_model()).save(model)
    Tokenizer.load(data).save(model)
    lines = scratch / "verses.txt"
    verses = [source for source, _ in load_corpus("bible-en-es").splits["test"][:TRANSLATE_LINES]]
    lines.write_text("".join(verse + "\n" for verse in verses), encoding="utf-8")
    return model, lines


def measure_translate(checkout: Path, model: Path, lines: Path, threads: int) -> float:
    """Lines/s of `checkout`'s `aiayn translate` of `lines` with `model`, over the process's wall time."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "aiayn", "translate", str(model), "--input", str(lines), "--output",
                   str(Path(scratch) / "out.txt")]
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=thread_env(threads, PYTHONPATH=str(checkout)),
                              cwd=scratch)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"revisions: {checkout}: aiayn translate failed:\n{proc.stderr[-2000:]}")
    return TRANSLATE_LINES / seconds


def measure_demo(checkout: Path, data: Path, threads: int) -> float:
    """Target tokens/s of steps 51-100 of `checkout`'s `aiayn train` of the demo's model and recipe
    on the encoded corpus `data`, as its log reports them."""
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        command = learning_curve.train_command("pre-norm", run, data, DEMO_STEPS, save_every=DEMO_STEPS)
        command += ["--recipe", "fast"]  # what the fast recipe adds in bf16 is the checkout's own
        env = thread_env(threads, PYTHONPATH=str(checkout))
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=scratch)
        if proc.returncode != 0:
            sys.exit(f"revisions: {checkout}: aiayn train failed:\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        rates = [r["tokens_per_s"] for r in records if r.get("split") == "train" and r["step"] > DEMO_STEPS // 2]
        return sum(rates) / len(rates)


def cut_shapes(checkout: Path, lengths: Path, budget: int, count: int, out: Path) -> None:
    """`checkout`'s speed.py batch shapes (its systems.corpus_shapes) of the lengths saved in
    `lengths`, written to `out`."""
    script = ("import json, sys, numpy, systems; json.dump(systems.corpus_shapes(numpy.load(sys.argv[1]), "
              "int(sys.argv[2]), int(sys.argv[3])), open(sys.argv[4], 'w'))")
    proc = subprocess.run([sys.executable, "-c", script, str(lengths), str(budget), str(count), str(out)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(checkout)),
                          cwd=checkout / "benchmarks")
    if proc.returncode != 0:
        sys.exit(f"revisions: {checkout}: cutting the {budget}-token batches failed:\n{proc.stderr[-2000:]}")


def measure(checkout: Path, args: list[str], threads: int) -> float:
    """tokens/s of one case, run by `checkout`'s benchmarks/one_case.py on its own aiayn."""
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, str(checkout / "benchmarks" / "one_case.py"), "--device", "cpu",
                           "--threads", str(threads), *args], capture_output=True, text=True, env=env,
                          cwd=checkout / "benchmarks")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"revisions: {checkout}: {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])["tokens_per_s"]


def unit(case: str) -> str:
    return "lines/s" if case == TRANSLATE else "tok/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", type=Path, required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--reps", type=positive_int, default=5, help="repetitions of every case on each side (default 5)")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--cases", nargs="+", choices=[*CASES, *BUDGETS, DEMO, TRANSLATE],
                        help="default: the fixed-shape cases, without bf16 on a CPU that has no hardware bf16")
    parser.add_argument("--out", type=Path, help="result file (default results/revisions-cpu.json)")
    args = parse_args(parser)
    cpu = torch.device("cpu")
    args.cases = args.cases or [case for case in CASES if "bf16" not in case or fast_bf16(cpu)]
    require_precision(*{"bf16" if "bf16" in case else "fp32" for case in args.cases})
    sides = {"this": HERE.parent, "other": args.other.resolve()}
    if not (sides["other"] / "benchmarks" / "one_case.py").is_file():
        sys.exit(f"revisions: {args.other} is not an aiayn checkout with benchmarks/one_case.py")
    runs: dict[str, dict[str, list[float]]] = {case: {side: [] for side in sides} for case in args.cases}
    with tempfile.TemporaryDirectory(prefix="revisions-") as scratch:
        data = learning_curve.prepare_data(Path(scratch)) if {DEMO, TRANSLATE} & set(args.cases) else None
        translating = translate_inputs(Path(scratch), data) if TRANSLATE in args.cases else None
        cases = {side: dict(CASES) for side in sides}
        timed_shapes = {case: {} for case in args.cases if case in BUDGETS}  # each side's (rows, source, target)
        if any(case in BUDGETS for case in args.cases):
            lengths = Path(scratch, "lengths.npy")
            numpy.save(lengths, systems.corpus_lengths(Path(scratch)))
        for case in args.cases:
            if case in BUDGETS:
                precision, budget, warmup, count, compiled = BUDGETS[case]
                for side, checkout in sides.items():
                    shapes = Path(scratch, f"shapes-{side}-{budget}.json")
                    if not shapes.exists():  # a budget's shapes serve both precisions
                        cut_shapes(checkout, lengths, budget, count, shapes)
                    cases[side][case] = ["train", "--system", "aiayn", "--precision", precision, "--shapes",
                                         str(shapes), "--warmup", str(warmup), *(["--compile"] if compiled else [])]
                    timed_shapes[case][side] = json.loads(shapes.read_text())
        for rep in range(args.reps):
            for case in args.cases:
                for side in (("this", "other") if rep % 2 == 0 else ("other", "this")):
                    if case == DEMO:
                        runs[case][side].append(measure_demo(sides[side], data, args.threads))
                    elif case == TRANSLATE:
                        runs[case][side].append(measure_translate(sides[side], *translating, args.threads))
                    else:
                        runs[case][side].append(measure(sides[side], cases[side][case], args.threads))
                this, other = runs[case]["this"][-1], runs[case]["other"][-1]
                print(f"rep {rep + 1}: {case}: this {this:,.2f} {unit(case)}, other {other:,.2f} {unit(case)}",
                      flush=True)
    precisions = sorted({"bf16" if "bf16" in case else "fp32" for case in args.cases})
    torch.set_num_threads(args.threads)
    results = {
        "benchmark": "revisions", "command": command_line(), "cpu_kind": cpu_kind(), "machine": machine(cpu, args.threads),
        # measured after the runs, on the threads they used: what their shares of the machine divide by
        "matmul_peak_tflops": {p: round(matmul_peak_flops(cpu, p) / 1e12, 3) for p in precisions},
        "this": revision(sides["this"]), "other": revision(sides["other"]),
        "shapes": timed_shapes,
        "cases": {case: {side: spread(values) for side, values in by_side.items()} | {
            "ratio_of_medians": spread(by_side["this"])["median"] / spread(by_side["other"])["median"],
            "unit": unit(case), "runs": by_side} for case, by_side in runs.items()},
    }
    for case, result in results["cases"].items():
        this, other = result["this"], result["other"]
        print(f"{case}: this {this['median']:,.2f} ({this['min']:,.2f}-{this['max']:,.2f}), other "
              f"{other['median']:,.2f} ({other['min']:,.2f}-{other['max']:,.2f}) {unit(case)}: "
              f"×{result['ratio_of_medians']:.3f}")
    write_results(args.out or HERE / "results" / "revisions-cpu.json", results)


if __name__ == "__main__":
    main()
