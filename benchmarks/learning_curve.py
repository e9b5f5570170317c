"""Learning curves at equal steps and at equal time: aiayn under one change at a time, and Eole
0.6.4, each trained with the same recipe and scored at checkpoints along the way.

The corpus is encoded once (`aiayn preprocess`, runs/.../data) and every run reads it: each
trains the demo's model (the `small` preset with `aiayn.config.DEMO_MODEL_CHANGES`: 3 + 3
layers, d_model 256, 4 heads, d_ff 1024, vocabulary 4,000, dropout 0) on bible-en-es with the
demo's recipe (`DEMO_RECIPE`: 2,000-token batches, warm-up 300, lr scale 0.5, label smoothing
0.1), bf16, seed 1, for `--steps` steps (or `--minutes` of wall clock from its launch), and
keeps a checkpoint every `--save-every` steps (default `--every`). A variant changes one knob of
that baseline (`VARIANTS`; "paper" is the post-norm model of §3.1); `eole` is Eole trained by its
harness (benchmarks/peers/eole_peer.py) on the same pieces, with the same shape and recipe in its
own config (pre-norm: the only form of its decoder), in fp32 by default (Eole's bf16 is pure bf16,
its weights included), and `--eole-variants` Eole under one change (`EOLE_VARIANTS`).

Every checkpoint then decodes the first `--sentences` test verses with beam 4 and α 0.6 (§6.1,
source length + 50; aiayn in bf16, Eole in its own decoder) and is scored by sacreBLEU, by the
hypothesis/reference length ratio and by the repetition rate (the share of output 4-grams that
repeat one earlier in the same sentence: looping outputs score high); with `--average N`, so is
the average of the N checkpoints that end at each scored step (§6.1, what the demo translates
with; Eole's are averaged here, it has no tool for it). A checkpoint's time is the
wall clock from its run's launch to the checkpoint's file, so that the curves compare at equal
time as well; runs are trained `--jobs` at a time with `--threads` threads each (one core each,
side by side, by default), so times compare only within one call.

    .venv/bin/python benchmarks/learning_curve.py --variants paper pre-norm --eole   # ~20 min per pair of runs
    .venv/bin/python benchmarks/learning_curve.py --variants pre-norm --eole --minutes 40 --every 250 --runs runs/curve-40min
    .venv/bin/python benchmarks/learning_curve.py --variants pre-norm --eole --minutes 40 --every 250 --save-every 50 --average 5 --runs runs/curve-40min-avg
    .venv/bin/python benchmarks/learning_curve.py --guards paper 800   # the decoding guards on a looping checkpoint
    .venv/bin/python benchmarks/learning_curve.py --steps 40 --every 20 --sentences 10 --runs /tmp/c --out /tmp/c.json  # smoke test

Needs Eole's environment for --eole: `bash benchmarks/setup_train_peers.sh`. Resumable: a
finished run or score is reused by a second call. Writes results/learning-curve-KIND.json and
prints the tables; the run folders go to runs/learning-curve/.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from safetensors.torch import load_file, save_file

from aiayn.config import DEMO_MODEL_CHANGES, DEMO_RECIPE, DecodeConfig, TrainConfig, demo_model
from aiayn.device import cpu_kind
from aiayn.evaluate import score_hypotheses
from aiayn.model import Transformer
from aiayn.store import load_store
from aiayn.tokenizer import Tokenizer
from aiayn.run import LOG, RunDir, average_checkpoints, read_log
from aiayn.translate import Translator
from common import (PEER_ENVS, RESULTS, command_line, machine, parse_args, positive_float, positive_int,
                    require_precision, write_results)
from peers.harness import run_for, stop_children_on_signals, thread_env
from quality_per_hour import peer, write_pieces

PRESET, PRECISION, SEED = "small", "bf16", 1
DECODE = DecodeConfig(precision=PRECISION, min_len=0)  # §6.1: beam 4, α 0.6, source length + 50; no minimum, as the peers
DEMO_TRAINING = TrainConfig(**DEMO_RECIPE)  # the recipe every system trains with

# name -> (ModelConfig changes, TrainConfig changes) from the demo's model and recipe. "paper"
# is that recipe as §5 has it (post-norm); each other variant changes one knob.
VARIANTS: dict[str, tuple[dict, dict]] = {
    "paper": ({}, {}),
    "pre-norm": ({"norm_first": True}, {}),
    "xavier-embeddings": ({}, {}),  # the initial weights of XAVIER_EMBEDDINGS
    "pre-norm,xavier-embeddings": ({"norm_first": True}, {}),
    "adam-eps-1e-8": ({}, {"adam_eps": 1e-8}),  # fairseq's and Eole's default ε
    "no-embedding-scale": ({"scale_embedding": False}, {}),
    "no-label-smoothing": ({}, {"label_smoothing": 0.0}),
    "warmup-150": ({}, {"warmup_steps": 150}),
    "lr-x2": ({}, {"lr_scale": 1.0}),
    "lr-x0.5": ({}, {"lr_scale": 0.25}),
    "pre-norm,lr-x2": ({"norm_first": True}, {"lr_scale": 1.0}),
    "pre-norm,lr-x4": ({"norm_first": True}, {"lr_scale": 2.0}),
    "pre-norm,lr-x0.7": ({"norm_first": True}, {"lr_scale": 0.35}),
    "pre-norm,lr-x1.4": ({"norm_first": True}, {"lr_scale": 0.7}),
    "batch-4000": ({}, {"max_tokens": 4000}),
    "pre-norm,warmup-150": ({"norm_first": True}, {"warmup_steps": 150}),
    "pre-norm,no-label-smoothing": ({"norm_first": True}, {"label_smoothing": 0.0}),
    "pre-norm,fp32": ({"norm_first": True}, {"precision": "fp32"}),
    "pre-norm,bf16-weights": ({"norm_first": True}, {"bf16_weights": True}),  # a bf16 copy trains, fp32 master
}
# Variants that start from Eole's initialisation of the shared embedding matrix, xavier_uniform
# (U(±√(6 / (V + d_model))), std 0.022 here), instead of aiayn's N(0, d_model^-0.5) (std 0.0625).
XAVIER_EMBEDDINGS = {"xavier-embeddings", "pre-norm,xavier-embeddings"}

# Eole runs: name -> flags of its harness's `train`. "eole" is the paper's layers as the peer
# has them (pre-norm, biases everywhere, a trained bias on its tied output layer); the ablation
# drops that output bias, which aiayn's tied output layer does not have.
EOLE_VARIANTS: dict[str, list[str]] = {"eole": [], "eole,no-output-bias": ["--no-output-bias"]}


def prepare_data(runs: Path) -> Path:
    """The corpus encoded once (`aiayn preprocess`, the demo's vocabulary), read by every aiayn run
    (`--data`) and cut into the same pieces for Eole: one tokenizer, one set of pairs for all."""
    data = runs / "data"
    if not (data / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "aiayn", "preprocess", "--corpus", DEMO_RECIPE["corpus"], "--out", str(data),
                        "--vocab-size", str(DEMO_MODEL_CHANGES["vocab_size"]), "--force"], check=True, stdout=subprocess.DEVNULL)
    return data


def initial_weights(name: str, run: Path, data: Path) -> Optional[Path]:
    """For a variant of XAVIER_EMBEDDINGS, a model folder with the weights `aiayn train` would
    draw (same seed), its embeddings then drawn as Eole draws them (the pad row stays zero), which
    the run starts from (`--init-from`, with the data's tokenizer); None for the others."""
    if name not in XAVIER_EMBEDDINGS:
        return None
    folder = run.parent / f"{name}.init"
    if not (folder / "tokenizer.model").exists():
        torch.manual_seed(SEED)
        model = Transformer(dataclasses.replace(demo_model(PRESET, "paper"), **VARIANTS[name][0]))
        embedding = model.encoder.embed.lookup
        with torch.no_grad():
            torch.nn.init.xavier_uniform_(embedding.weight)
            embedding.weight[model.config.pad_id] = 0
        model.save(folder, force=True)  # (a folder a kill left without its tokenizer)
        Tokenizer.load(data).save(folder)
    return folder


def train_command(name: str, run: Path, data: Path, steps: int, save_every: int) -> list[str]:
    model_changes, recipe_changes = VARIANTS[name]
    recipe = {**DEMO_RECIPE, "corpus": None, "data": str(data), "max_steps": steps, "save_every": save_every, "save_minutes": None,
              "keep_last": steps // save_every + 1, "eval_every": 10**9, "precision": PRECISION, "seed": SEED,
              "init_from": initial_weights(name, run, data), **recipe_changes}
    model = {**DEMO_MODEL_CHANGES, **model_changes}
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**recipe, **model}.items() if v is not None]
    return [sys.executable, "-m", "aiayn", "train", "--preset", PRESET, "--out", str(run), *flags]


def train_aiayn(name: str, run: Path, data: Path, steps: int, save_every: int, threads: int, minutes: Optional[float]) -> None:
    """`aiayn train` of one variant, for `steps` steps or, with `minutes`, stopped by SIGTERM that
    long after its launch (as the peers' harnesses stop theirs)."""
    if (run / "launched.json").exists():
        return
    if run.exists():
        sys.exit(f"{run} holds an unfinished run: remove it to train it again")
    run.mkdir(parents=True)
    started = time.time()
    command = train_command(name, run, data, steps, save_every)
    if minutes:
        run_for(command, minutes, run.parent / f"{name}.log", thread_env(threads))
    else:
        with open(run.parent / f"{name}.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=thread_env(threads))
    (run / "launched.json").write_text(json.dumps({"launched": started}))


def train_eole(name: str, run: Path, pieces: Path, steps: int, save_every: int, threads: int, precision: str,
               minutes: Optional[float]) -> None:
    if (run / "trained.json").exists():
        return
    model = demo_model(PRESET, "paper")  # the shape; Eole's layers are pre-norm whatever the recipe
    flags = {"layers": model.n_layers, "d-model": model.d_model, "heads": model.n_heads, "d-ff": model.d_ff,
             "dropout": model.dropout, "label-smoothing": DEMO_TRAINING.label_smoothing,
             "max-tokens": DEMO_TRAINING.max_tokens, "warmup-steps": DEMO_TRAINING.warmup_steps,
             "lr-scale": DEMO_TRAINING.lr_scale, "seed": SEED, "save-every": save_every, "keep-last": steps // save_every + 1,
             "max-steps": steps, "precision": precision, "minutes": minutes or 10**4}
    started = time.time()
    result = peer("eole", ["train", "--data", str(pieces), "--out", str(run),
                           *[str(x) for k, v in flags.items() for x in (f"--{k}", v)], *EOLE_VARIANTS[name]], threads)
    (run / "trained.json").write_text(json.dumps({**result, "launched": started}))


def checkpoints(system: str, run: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint of a run, in step order."""
    if system in EOLE_VARIANTS:
        found = [(int(p.name.split("_")[1]), p) for p in (run / "model").glob("step_*") if (p / "config.json").is_file()]
    else:
        found = [(int(p.name.split("_")[1]), p) for p in RunDir(run).checkpoints()]
    return sorted(found)


# Decoding guards tried on one aiayn checkpoint (`--guards SYSTEM STEP`): DecodeConfig changes.
GUARDS: dict[str, dict] = {
    "none (§6.1)": {},
    "no-repeat-ngram-size 4": {"no_repeat_ngram_size": 4},
    "no-repeat-ngram-size 3": {"no_repeat_ngram_size": 3},
    "repetition-penalty 1.2": {"repetition_penalty": 1.2},
}


def score_checkpoint(system: str, checkpoint: Path, runs: Path, sentences: int, threads: int,
                     decode: DecodeConfig = DECODE) -> dict:
    """Beam-decode the test verses with one checkpoint and score them."""
    tokenizer = Tokenizer.load(runs / "data")
    test = load_store(runs / "data").texts("test")[:sentences]
    references = [t for _, t in test]
    start = time.perf_counter()
    if system in EOLE_VARIANTS:
        source, out = runs / "scores" / f"{system}-{checkpoint.name}.src", runs / "scores" / f"{system}-{checkpoint.name}.hyp"
        source.parent.mkdir(parents=True, exist_ok=True)
        lines = (runs / "pieces" / "test.src").read_text(encoding="utf-8").splitlines()[: len(test)]
        source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        peer("eole", ["translate", "--model", str(checkpoint), "--src", str(source), "--out", str(out),
                      "--beam", str(DECODE.beam), "--alpha", str(DECODE.alpha), "--extra-len", str(DECODE.extra_len)], threads)
        hypotheses = [tokenizer.decode([tokenizer.piece_to_id(p) for p in line.split()])
                      for line in out.read_text(encoding="utf-8").splitlines()]
    else:
        hypotheses = Translator(Transformer.load(checkpoint), tokenizer, decode).translate([s for s, _ in test])
    result = score_hypotheses(hypotheses, references, time.perf_counter() - start)
    return {**result.to_dict(), "sentences": len(test), "sample": hypotheses[:3]}


def score_run(system: str, runs: Path, every: int, sentences: int, threads: int, average: int, extra: list[int]) -> None:
    """Score the run's checkpoints at multiples of `every` and at the `extra` steps in a fresh
    process of `threads` threads, each to runs/scores/SYSTEM-STEP.json (one already there is kept)."""
    subprocess.run([sys.executable, __file__, "--score-run", system, "--runs", str(runs), "--every", str(every),
                    "--sentences", str(sentences), "--threads", str(threads), "--average", str(average),
                    "--also-score", *map(str, extra)], check=True, env=thread_env(threads))


def average_eole(folders: list[Path], out: Path) -> None:
    """§6.1's average for Eole checkpoints (Eole 0.6.4 has no averaging tool): the mean of their
    weights, summed in float64, in a folder Eole's translate reads (its config and vocabulary)."""
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for folder in folders:
        for name, tensor in load_file(str(folder / "model.00.safetensors")).items():
            total[name], dtypes[name] = total.get(name, 0) + tensor.double(), tensor.dtype
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: (t / len(folders)).to(dtypes[name]).contiguous() for name, t in total.items()},
              str(out / "model.00.safetensors"))
    for name in ("config.json", "vocab.json"):
        (out / name).write_bytes((folders[-1] / name).read_bytes())


def scores_file(runs: Path, system: str, step: int, average: int) -> Path:
    """Where the scores of a checkpoint (average 1) or of the average of the `average` checkpoints
    that end at `step` are kept."""
    return runs / "scores" / (f"{system}-{step:08d}.json" if average == 1 else f"{system}-avg{average}-{step:08d}.json")


def score_checkpoints(system: str, runs: Path, every: int, sentences: int, threads: int, average: int,
                      extra: list[int]) -> None:
    """Every checkpoint at a multiple of `every` or in `extra`, and with `average` > 1 also the mean of the
    `average` checkpoints that end there (§6.1, as the demo translates with), scored."""
    found = checkpoints(system, runs / system)
    for index, (step, checkpoint) in enumerate(found):
        if step % every and step not in extra:
            continue
        for n in sorted({1, average}):
            out = scores_file(runs, system, step, n)
            if out.exists() or index + 1 < n:
                continue
            if n == 1:
                result = score_checkpoint(system, checkpoint, runs, sentences, threads)
            else:
                folders = [folder for _, folder in found[index + 1 - n: index + 1]]
                averaged = runs / "scores" / f"{system}-averaged"
                if system in EOLE_VARIANTS:
                    average_eole(folders, averaged)
                else:
                    average_checkpoints(folders, averaged, force=True)
                result = score_checkpoint(system, averaged, runs, sentences, threads)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
            print(f"{system} step {step}{f' (average of {n})' if n > 1 else ''}: test BLEU {result['bleu']}, "
                  f"length ratio {result['length_ratio']}, repeated 4-grams {result['repetition_4gram']:.1%}", flush=True)


def seconds_since_launch(system: str, run: Path, checkpoint: Path) -> float:
    """Wall clock from the run's launch to its checkpoint's last file (Eole writes config.json last)."""
    launched = json.loads((run / ("trained.json" if system in EOLE_VARIANTS else "launched.json")).read_text())["launched"]
    written = (checkpoint / "config.json").stat().st_mtime if system in EOLE_VARIANTS else max(
        p.stat().st_mtime for p in checkpoint.iterdir())
    return round(written - launched, 1)


def train_perplexities(run: Path) -> dict[int, float]:
    """An aiayn run's training perplexity at each step its log records (the batches since the
    record before)."""
    return {r["step"]: round(r["ppl"], 2) for r in read_log(run / LOG, echo=lambda _: None) if r.get("split") == "train"}


def pivot_markdown(rows: dict) -> str:
    """The curves side by side at equal steps: per cell test BLEU, hyp/ref length, repeated 4-grams."""
    systems = [system for system, points in rows.items() if points]
    steps = sorted({p["step"] for points in rows.values() for p in points})
    lines = ["| step | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for step in steps:
        cells = []
        for system in systems:
            p = next((p for p in rows[system] if p["step"] == step), None)
            cells.append(f"**{p['bleu']:.1f}** · {p['length_ratio']:.2f} · {p['repetition_4gram']:.0%}" if p else "")
        lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_markdown(rows: dict) -> str:
    lines = ["| system | step | minutes | test BLEU | hyp/ref length | repeated 4-grams | training perplexity |",
             "|---|---|---|---|---|---|---|"]
    for system, points in rows.items():
        for p in points:
            lines.append(f"| {system} | {p['step']:,} | {p['seconds'] / 60:.1f} | {p['bleu']:.2f} | {p['length_ratio']:.2f} | "
                         f"{p['repetition_4gram']:.1%} | {p.get('train_ppl', '')} |")
    return "\n".join(lines) + "\n"


def score_guards(runs: Path, variant: str, step: int, sentences: int, threads: int, out) -> None:
    """The decoding guards against looping outputs (fairseq's, HF's, CTranslate2's), each on one
    checkpoint: what they give a model that loops. Not a training recipe: §6.1 decodes without them."""
    torch.set_num_threads(threads)
    checkpoint = dict(checkpoints(variant, runs / variant)).get(step)
    if checkpoint is None:
        sys.exit(f"{runs / variant} has no checkpoint at step {step}")
    rows = {name: score_checkpoint(variant, checkpoint, runs, sentences, threads, dataclasses.replace(DECODE, **changes))
            for name, changes in GUARDS.items()}
    lines = ["| decoding | test BLEU | hyp/ref length | repeated 4-grams |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['bleu']:.2f} | {r['length_ratio']:.2f} | {r['repetition_4gram']:.1%} |" for name, r in rows.items()]
    table = "\n".join(lines) + "\n"
    print(f"\n{variant} at step {step}, {sentences} test verses, beam 4:\n" + table)
    write_results(out or RESULTS / f"decoding-guards-{cpu_kind()}.json", {
        "benchmark": "decoding-guards", "command": command_line(), "machine": machine(torch.device("cpu"), threads),
        "settings": {"variant": variant, "step": step, "sentences": sentences, "guards": GUARDS},
        "rows": rows, "table_markdown": table,
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["paper", "pre-norm"])
    parser.add_argument("--eole", action="store_true", help="train and score Eole 0.6.4 too (benchmarks/setup_train_peers.sh)")
    parser.add_argument("--eole-variants", nargs="+", choices=[v for v in EOLE_VARIANTS if v != "eole"], default=[],
                        help="Eole under one change each (EOLE_VARIANTS), trained and scored too")
    parser.add_argument("--steps", type=positive_int, default=1200, help="training steps of every run (default 1200)")
    parser.add_argument("--minutes", type=positive_float,
                        help="instead of --steps: stop every run this long after its launch (wall clock), as at equal time")
    parser.add_argument("--every", type=positive_int, default=200, help="steps between the checkpoints scored (default 200)")
    parser.add_argument("--save-every", type=positive_int, help="steps between the checkpoints kept (default: --every)")
    parser.add_argument("--average", type=positive_int, default=1,
                        help="also score the average of the last N checkpoints at each scored step (§6.1; default 1: none)")
    parser.add_argument("--also-score", type=positive_int, nargs="*", default=[], metavar="STEP",
                        help="score the checkpoints of these steps too (where a curve crosses another, say)")
    parser.add_argument("--sentences", type=positive_int, default=500, help="test verses decoded per checkpoint (default 500)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="runs trained (and checkpoints scored) at once (default 2)")
    parser.add_argument("--threads", type=positive_int, default=1, help="threads of each job (default 1)")
    parser.add_argument("--runs", type=Path, default=Path("runs/learning-curve"), help="folder of the run folders")
    parser.add_argument("--out", type=Path, help="result file (default results/learning-curve-KIND.json)")
    parser.add_argument("--eole-precision", choices=("fp32", "bf16"), default="fp32",
                        help="Eole's training precision (default fp32; its bf16 is pure bf16, weights included)")
    parser.add_argument("--score-run", metavar="SYSTEM", help=argparse.SUPPRESS)  # one run's scoring, in its own process
    parser.add_argument("--guards", nargs=2, metavar=("VARIANT", "STEP"),
                        help="only decode that aiayn run's checkpoint with each of the decoding guards (GUARDS) and score it")
    args = parse_args(parser)
    stop_children_on_signals()
    if args.guards:
        variant, step = args.guards
        if not step.isdigit():  # (found in a misuse hunt: a traceback)
            parser.error(f"--guards {variant} {step}: STEP is a checkpoint's step, a whole number")
        return score_guards(args.runs, variant, int(step), args.sentences, args.threads, args.out)
    if args.score_run:
        torch.set_num_threads(args.threads)
        return score_checkpoints(args.score_run, args.runs, args.every, args.sentences, args.threads, args.average,
                                 args.also_score)
    require_precision(PRECISION, *([args.eole_precision] if args.eole or args.eole_variants else []))
    if (args.eole or args.eole_variants) and not PEER_ENVS["eole"][0].exists():  # (found in a misuse hunt: said after
        sys.exit(f"learning_curve: {PEER_ENVS['eole'][0]} missing: run `bash benchmarks/setup_train_peers.sh`")  # aiayn's runs)
    save_every = args.save_every or args.every
    if min(args.steps, args.every, save_every, args.average, args.sentences, args.jobs, args.threads) < 1:
        sys.exit("--steps, --every, --save-every, --average, --sentences, --jobs and --threads must be positive")
    if args.minutes is None and args.steps % args.every or args.every % save_every:
        sys.exit("--steps must be a multiple of --every, and --every of --save-every")
    if args.minutes is not None and not args.minutes > 0:
        sys.exit("--minutes must be positive")
    steps = 10**6 if args.minutes else args.steps  # a time budget: the clock stops the runs
    variants = list(dict.fromkeys(args.variants))
    runs = args.runs
    runs.mkdir(parents=True, exist_ok=True)
    data = prepare_data(runs)
    eoles = (["eole"] if args.eole else []) + args.eole_variants
    if eoles and not (runs / "pieces" / "vocab.txt").exists():
        write_pieces(data, runs / "pieces")
    systems = variants + eoles

    def train_and_score(system: str) -> None:
        if system in EOLE_VARIANTS:
            train_eole(system, runs / system, runs / "pieces", steps, save_every, args.threads, args.eole_precision, args.minutes)
        else:
            train_aiayn(system, runs / system, data, steps, save_every, args.threads, args.minutes)
        score_run(system, runs, args.every, args.sentences, args.threads, args.average, args.also_score)

    # The runs that still train go first, Eole's (the slowest) ahead, so that scoring fills the slots they leave.
    trained = lambda system: (runs / system / ("trained.json" if system in EOLE_VARIANTS else "launched.json")).exists()  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for job in [pool.submit(train_and_score, s) for s in sorted(systems, key=lambda s: (trained(s), s not in EOLE_VARIANTS))]:
            job.result()

    found = {system: checkpoints(system, runs / system) for system in systems}
    rows = {}
    for system in systems:
        perplexities = {} if system in EOLE_VARIANTS else train_perplexities(runs / system)  # (Eole's log is its own)
        for n in sorted({1, args.average}):
            name = system if n == 1 else f"{system}, average of {n}"
            rows[name] = []
            for step, path in found[system]:
                scores = scores_file(runs, system, step, n)
                if scores.exists():
                    rows[name].append({"step": step, "seconds": seconds_since_launch(system, runs / system, path),
                                       **json.loads(scores.read_text()),
                                       **({"train_ppl": perplexities[step]} if n == 1 and step in perplexities else {})})
    table, pivot = table_markdown(rows), pivot_markdown(rows)
    print("\n" + table + "\ntest BLEU · hyp/ref length · repeated 4-grams, at equal steps:\n\n" + pivot)
    write_results(args.out or RESULTS / f"learning-curve-{cpu_kind()}.json", {
        "benchmark": "learning-curve", "command": command_line(), "machine": machine(torch.device("cpu"), args.threads),
        "settings": {"steps": None if args.minutes else args.steps, "minutes": args.minutes, "every": args.every,
                     "save_every": save_every, "average": args.average, "sentences": args.sentences, "jobs": args.jobs,
                     "preset": PRESET, "model_changes": DEMO_MODEL_CHANGES, "recipe": DEMO_RECIPE, "precision": PRECISION,
                     "eole_precision": args.eole_precision if eoles else None, "decode": DECODE.__dict__, "variants": {v: VARIANTS[v] for v in variants},
                     "eole_variants": {v: EOLE_VARIANTS[v] for v in eoles}},
        "systems": rows, "table_markdown": table, "pivot_markdown": pivot,
    })


if __name__ == "__main__":
    main()
