"""The demo recipe, searched: which values of the knobs a user of `aiayn train` may set give the
best BLEU after `aiayn demo`'s training budget (10 minutes) on this machine.

The method stays the paper's (§5: Adam with the warm-up/inverse-square-root rate, label
smoothing, dropout; §6.1: checkpoint averaging, beam 4, α 0.6); only its numbers are searched.
A greedy coordinate search from the demo recipe as it was before the search (`START`; the
recipe's other settings are `aiayn.config.DEMO_RECIPE`'s, the model the `small` preset): each
knob in turn, each of its candidate values is tried with everything else at the best so far,
and a value is kept when it raises the dev BLEU. Every candidate is a full
`aiayn train` in a fresh process with the demo's budget, recipe and seed. Its dev split (647
verses) is then beam-decoded twice: with the final weights, and with the average of the last 5
checkpoints (§6.1), which costs no training time, so averaging is judged on every run. The test
books are decoded only for the baseline and the winner, for the figures.

Every run is the paper's post-norm model (`aiayn train`'s default `--recipe paper`), as the demo
was when the search ran; the demo now trains its winner with the `fast` recipe (pre-norm), whose
reasons are in docs/learning-curve-amd-epyc.md.

One run per candidate, one seed: differences smaller than the noise of a seed (not measured
here) decide nothing; the table shows every run.

    .venv/bin/python benchmarks/demo_recipe.py --docs docs/demo-recipe-KIND.md   # ~12 min per candidate, resumable
    .venv/bin/python benchmarks/demo_recipe.py --minutes 0.05 --sentences 8 --runs /tmp/s --out /tmp/s.json  # smoke test

Writes results/demo-recipe-KIND.json (KIND: the CPU kind) and its table as markdown; the run
folders go to runs/demo-recipe/ (a second call reuses finished runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

from aiayn.files import atomic_write
from aiayn.run import RunDir, average_checkpoints
from aiayn.config import DEMO_AVERAGE_LAST, DEMO_RECIPE, DecodeConfig
from aiayn.device import cpu_kind
from aiayn.evaluate import score as evaluate_score
from aiayn.model import Transformer
from aiayn.store import load_store
from aiayn.tokenizer import Tokenizer
from aiayn.translate import Translator
from common import (RESULTS, check_output, command_line, machine, or_exit, parse_args, positive_float, positive_int,
                    require_precision, write_results)

MINUTES = 10.0  # aiayn demo's default budget
PRESET = "small"
PRECISION = "bf16"  # the demo's, on both CPU kinds
SEED = 1
AVERAGE_LAST = DEMO_AVERAGE_LAST  # §6.1; checkpoints every DEMO_RECIPE["save_every"] steps

# The knobs in the order they are searched, with the values tried against the current demo
# recipe. Vocabulary first: it changes the cost of every step (the output projection) and the
# tokenizer every later run shares.
KNOBS: dict[str, list] = {
    "vocab_size": [4000],
    "lr_scale": [1.0],
    "dropout": [0.0],
    "max_tokens": [2000],
    "warmup_steps": [150],
}
MODEL_KNOBS = {"vocab_size", "dropout"}  # ModelConfig fields; the rest are TrainConfig's


# Where the search starts: the demo's recipe before the search chose today's (the `small`
# preset then had an 8,000-token vocabulary). Fixed here, so that the search and its run folders
# stay the same after the demo's defaults take its result.
START = {"vocab_size": 8000, "dropout": 0.1, "lr_scale": 0.5, "max_tokens": 3000, "warmup_steps": 300}


def baseline() -> dict:
    """The start of the search."""
    return dict(START)


def name_of(values: dict) -> str:
    """A run folder name: the knobs that differ from the baseline, or 'baseline'."""
    changed = [f"{k}={v}" for k, v in values.items() if v != baseline()[k]]
    return ",".join(changed) or "baseline"


def train(values: dict, run: Path, minutes: float) -> None:
    """`aiayn train` with the demo's recipe, `values` in place of its searched knobs, in a fresh
    process."""
    recipe = {**DEMO_RECIPE, **{k: v for k, v in values.items() if k not in MODEL_KNOBS},
              "minutes": minutes,
              "precision": PRECISION, "seed": SEED}
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in recipe.items()]
    flags += [f"--{k.replace('_', '-')}={values[k]}" for k in MODEL_KNOBS]
    command = [sys.executable, "-m", "aiayn", "train", "--preset", PRESET, "--out", str(run), *flags]
    print(" ".join(command[1:]), flush=True)
    if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:  # (found in a misuse hunt: a traceback)
        sys.exit(f"demo_recipe: aiayn train failed for {run} (its error is above)")


def score(model_dir: Path, run: Path, split: str, sentences: Optional[int]) -> dict:
    """BLEU of the split (its first `sentences`; None: all) beam-decoded as the demo does (§6.1:
    beam 4, α 0.6; bf16)."""
    translator = Translator(Transformer.load(model_dir), Tokenizer.load(model_dir), DecodeConfig(precision=PRECISION))
    pairs = load_store(RunDir(run).data).texts(split)[:sentences]
    result = evaluate_score(translator, pairs)
    return {"bleu": round(result.bleu, 2), "sentences": len(pairs), "decode_s": round(result.seconds, 1),
            "signature": result.signature}


def evaluate(run: Path, sentences: Optional[int]) -> dict:
    """The dev BLEU with the final weights and with the last checkpoints averaged, plus the
    run's steps, speed and memory from its log."""
    averaged = run / f"averaged-last-{AVERAGE_LAST}"
    if not averaged.exists():
        average_checkpoints(RunDir(run).checkpoints()[-AVERAGE_LAST:], averaged)
    trained = [r for r in RunDir(run).read_log() if r.get("split") == "train"]
    return {
        "steps": trained[-1]["step"], "train_s": trained[-1]["elapsed_s"],
        "tokens_per_s_median": sorted(r["tokens_per_s"] for r in trained)[len(trained) // 2],
        "rss_mib_last": trained[-1].get("rss_mib"),
        "dev": {"final": score(RunDir(run).final, run, "dev", sentences), "averaged": score(averaged, run, "dev", sentences)},
    }


def best_of(result: dict) -> tuple[float, str]:
    """A run's dev BLEU and which weights gave it (final or averaged)."""
    return max((result["dev"][w]["bleu"], w) for w in ("final", "averaged"))


def table_markdown(results: dict, winner: str, minutes: float) -> str:
    lines = [
        f"| run | steps in {minutes:g} min | median tok/s | dev BLEU, final weights | dev BLEU, last {AVERAGE_LAST} averaged | kept |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results["runs"].items():
        dev = result["dev"]
        lines.append(f"| {name} | {result['steps']:,} | {result['tokens_per_s_median']:,.0f} | {dev['final']['bleu']:.2f} | "
                     f"{dev['averaged']['bleu']:.2f} | {'**winner**' if name == winner else ('yes' if result['kept'] else '')} |")
    return "\n".join(lines) + "\n"


def write_docs(results: dict, path: Path) -> None:
    """The search as a page of the docs: its table, the winner and the test BLEU."""
    winner, m, runs = results["winner"], results["machine"], results["runs"]
    start, best = runs["baseline"], runs[winner["name"]]

    def test_line(name: str, result: dict) -> str:
        t = result["test"]
        return f"- {name}: {result['steps']:,} steps, test BLEU {t['bleu']:.2f} ({t['weights']} weights)"

    text = "\n".join([
        "# The demo recipe, searched", "",
        f"`{results['command']}` on {m['cpu']} ({', '.join(m['cpu_flags'])}), {m['threads_used']} threads, "
        f"{m['date'][:10]}. Each run trains the demo's model for {results['settings']['minutes']:g} minutes "
        "in bf16 with seed 1; its dev BLEU (647 verses, beam 4, α 0.6, sacreBLEU) decides. The test books "
        "are decoded only for the start and the winner. One seed per run: the noise between seeds was not "
        "measured, so small differences decide little.", "",
        results["table_markdown"],
        f"Winner: {winner['name']} with the {winner['weights']} weights, dev BLEU {winner['dev_bleu']:.2f}. "
        "On the test books:", "",
        test_line("start (the demo before the search)", start),
        test_line(f"winner ({winner['name']})", best), "",
        "sacreBLEU signature: " + best["test"]["signature"], "",
    ])
    or_exit(lambda: atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8")))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive_float, default=MINUTES, help="training time of every run (default 10, the demo's)")
    parser.add_argument("--runs", type=Path, default=Path("runs/demo-recipe"), help="folder of the run folders")
    parser.add_argument("--out", type=Path, help="result file (default results/demo-recipe-KIND.json)")
    parser.add_argument("--sentences", type=positive_int, help="score only the first N dev and test sentences (a smoke test)")
    parser.add_argument("--docs", type=Path, help="also write the table as a markdown page (docs/demo-recipe-KIND.md)")
    args = parse_args(parser)
    if not args.minutes > 0:
        sys.exit("--minutes must be positive")
    require_precision(PRECISION)  # (found in a misuse hunt: a traceback from the first run, which it left unfinished)
    if args.docs:  # checked as --out is, before hours of training (found in a misuse hunt: replaced, or a traceback at the end)
        check_output(args.docs, args.force)
    out = args.out or RESULTS / f"demo-recipe-{cpu_kind()}.json"

    results = {"benchmark": "demo-recipe", "command": command_line(), "machine": machine(torch.device("cpu"), torch.get_num_threads()),
               "settings": {"preset": PRESET, "precision": PRECISION, "seed": SEED, "minutes": args.minutes,
                            "save_every": DEMO_RECIPE["save_every"], "average_last": AVERAGE_LAST, "demo_recipe": DEMO_RECIPE,
                            "knobs": KNOBS},
               "runs": {}}

    def run_once(values: dict) -> dict:
        name = name_of(values)
        run = args.runs / name
        done = run / "search-result.json"
        if not done.exists():
            if run.exists():
                sys.exit(f"{run} holds an unfinished run: remove it to train it again")
            train(values, run, args.minutes)
            done.write_text(json.dumps({"values": values, **evaluate(run, args.sentences)}, indent=1))
        result = json.loads(done.read_text())
        results["runs"][name] = {**result, "kept": False}
        print(f"{name}: {result['steps']} steps, dev BLEU final {result['dev']['final']['bleu']}, "
              f"averaged {result['dev']['averaged']['bleu']}", flush=True)
        return result

    best = baseline()
    best_bleu = best_of(run_once(best))[0]
    results["runs"][name_of(best)]["kept"] = True
    for knob, candidates in KNOBS.items():
        for value in candidates:
            values = {**best, knob: value}
            bleu_value = best_of(run_once(values))[0]
            if bleu_value > best_bleu:
                best, best_bleu = values, bleu_value
                results["runs"][name_of(values)]["kept"] = True

    winner = name_of(best)
    weights = best_of(results["runs"][winner])[1]
    results["winner"] = {"name": winner, "values": best, "weights": weights, "dev_bleu": best_bleu}
    for name in dict.fromkeys(["baseline", winner]):  # test BLEU: the figures, never the choice
        run = args.runs / name
        model_dir = RunDir(run).final if best_of(results["runs"][name])[1] == "final" else run / f"averaged-last-{AVERAGE_LAST}"
        results["runs"][name]["test"] = {"weights": model_dir.name, **score(model_dir, run, "test", args.sentences)}
        print(f"{name}: test BLEU {results['runs'][name]['test']['bleu']} ({model_dir.name})", flush=True)
    results["table_markdown"] = table_markdown(results, winner, args.minutes)
    print("\n" + results["table_markdown"])
    write_results(out, results)
    if args.docs:
        write_docs(results, args.docs)


if __name__ == "__main__":
    main()
