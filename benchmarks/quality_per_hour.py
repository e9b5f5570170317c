"""Quality per CPU-hour: aiayn, Eole 0.6.4 and OpenNMT-py 3.0.4 trained one after the other for
the same wall-clock budget on bible-en-es, then each beam-decodes the test books.

Every system trains the same model (aiayn's `small` preset: 3 + 3 layers, d_model 256, 4 heads,
d_ff 1024, with `aiayn demo`'s model changes; pre-norm, as the demo's `fast` recipe and both
peers have it) with the same recipe (`aiayn.config.DEMO_RECIPE`:
tokens per batch, warm-up, learning-rate scale, label smoothing, dropout, seed), written in each
peer's own config by its harness (benchmarks/peers/). All share one SentencePiece vocabulary: the
one aiayn's run trains at its start; the peers get the corpus already cut into its pieces, and
their outputs are joined back with it. Each training process is stopped by SIGTERM once the
budget of wall-clock time since its launch is spent, and its last periodic checkpoint (every 50
steps) is what is decoded, not an average of checkpoints (the demo averages; the peers'
averaging tools are not wired in); no system validates during the budget. The peers read the
corpus with their own pipelines, with a bucket of 32,768 pairs (one pass over bible-en-es)
instead of their default 262,144, which cycles the corpus for minutes before the first step. aiayn trains in the demo's precision
(`--precision auto`: bf16 where the CPU computes it in hardware, else fp32) or the one given; Eole in the same, OpenNMT-py in fp32, which
is all it trains in on a CPU (its harness says so).

The test books (1,021 verses of Acts and Philemon) are decoded with beam 4 and α 0.6, outputs
limited to source length + 50 (§6.1), and scored with sacreBLEU against the original text.

    .venv/bin/python benchmarks/quality_per_hour.py                 # 3 × 20 min + decoding, ~70 min
    .venv/bin/python benchmarks/quality_per_hour.py --precision fp32  # every system in fp32 (an AVX2-only CPU's auto)
    .venv/bin/python benchmarks/quality_per_hour.py --minutes 0.5 --test-sentences 20 --runs /tmp/q --out /tmp/q.json  # smoke test

Needs the peers' environments: `bash benchmarks/setup_train_peers.sh`. Writes
results/quality-per-hour-KIND.json (KIND: the CPU kind; -KIND-fp32.json for a run in fp32); the run folders go to
runs/quality-per-hour/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import dataclasses
from pathlib import Path

import torch

from aiayn.config import DEMO_MODEL_CHANGES, DEMO_RECIPE, DEMO_RECIPE_NAME, DecodeConfig
from aiayn.device import cpu_kind, matmul_peak_flops, resolve_precision
from aiayn.evaluate import score, score_hypotheses
from aiayn.model import Transformer
from aiayn.store import load_store
from aiayn.tokenizer import Tokenizer
from aiayn.run import RunDir
from aiayn.translate import Translator
from common import (PEER_ENVS, RESULTS, command_line, default_threads, machine, parse_args, positive_float,
                    positive_int, replace_runs_folder, require_precision, write_results)
from peers.harness import run_for, stop_children_on_signals, thread_env

# The precisions each peer trains in on a CPU (see its harness's docstring): Eole in bf16 or fp32, OpenNMT-py in fp32 only.
PEER_PRECISIONS = {"eole": ("bf16", "fp32"), "onmt": ("fp32",)}
SYSTEMS = ("aiayn", *PEER_ENVS)
DECODE = DecodeConfig(min_len=0)  # §6.1: beam 4, α 0.6, source length + 50; no minimum, as the peers and earlier results
NO_VALIDATION = 10**9  # eval_every: no system validates inside the budget
SAVE_EVERY, KEEP_LAST = DEMO_RECIPE["save_every"], DEMO_RECIPE["keep_last"]  # every system's checkpoints, as the demo's


def peer_precision(name: str, precision: str) -> str:
    """The peer's training precision in a run whose aiayn trains in `precision`: the same, or fp32
    where the peer has no other."""
    return precision if precision in PEER_PRECISIONS[name] else "fp32"


def train_aiayn(run: Path, minutes: float, threads: int, precision: str) -> dict:
    """`aiayn train` with the demo's recipe (its named recipe, `fast`, included), stopped as the peers are. aiayn saves a checkpoint
    when stopped; the peers save none, so aiayn is judged, as they are, on its last periodic
    checkpoint."""
    recipe = {**DEMO_RECIPE, "eval_every": NO_VALIDATION, "precision": precision, "seed": 1}
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in recipe.items()]
    flags += [f"--{k.replace('_', '-')}={v}" for k, v in DEMO_MODEL_CHANGES.items()]  # the demo's model
    command = [sys.executable, "-m", "aiayn", "train", "--preset", "small", "--recipe", DEMO_RECIPE_NAME, "--out", str(run),
               *flags]
    log = run.parent / "aiayn-train.log"
    _, wall = run_for(command, minutes, log, thread_env(threads))
    periodic = [c for c in RunDir(run).checkpoints() if int(c.name.split("_")[1]) % SAVE_EVERY == 0]
    if not periodic:
        sys.exit(f"aiayn saved no checkpoint in {minutes:g} min: see {log}")
    return {"steps": max(r["step"] for r in RunDir(run).read_log() if r.get("split") == "train"), "wall_s": round(wall, 1),
            "checkpoint": str(periodic[-1]), "precision": precision}


def write_pieces(store_dir: Path, data: Path) -> Tokenizer:
    """The corpus exactly as aiayn encoded it (a data store and its tokenizer: the same pairs,
    the same pieces), one sentence of space-separated pieces per line, and the vocabulary in id
    order: what the peers train on."""
    tokenizer = Tokenizer.load(store_dir)
    store = load_store(store_dir)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        pairs = store.split(split)
        for side, name in ((0, "src"), (1, "tgt")):
            lines = (" ".join(pieces[i] for i in pairs[row][side].tolist()) + "\n" for row in range(len(pairs)))
            (data / f"{split}.{name}").write_text("".join(lines), encoding="utf-8")
    (data / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return tokenizer


def peer(name: str, args: list[str], threads: int) -> dict:
    """One harness call in the peer's own environment; its last stdout line is JSON."""
    python, script = PEER_ENVS[name]
    if not python.exists():
        sys.exit(f"{python} missing: run `bash benchmarks/setup_train_peers.sh`")
    proc = subprocess.run([str(python), str(script), *args, "--threads", str(threads)],
                          capture_output=True, text=True, env=thread_env(threads))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"{name} {args[0]} failed: " + "\n".join(proc.stderr.strip().splitlines()[-6:]))
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive_float, default=20.0, help="wall-clock training budget of each system (default 20)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--runs", type=Path, default=Path("runs/quality-per-hour"), help="folder of the run folders")
    parser.add_argument("--threads", type=positive_int, default=default_threads(), help="for every system (default: all cores)")
    parser.add_argument("--out", type=Path, help="result file (default results/quality-per-hour-KIND.json)")
    parser.add_argument("--force", action="store_true", help="replace the run folders of an earlier call")
    parser.add_argument("--test-sentences", type=positive_int, help="decode only the first N test verses (a smoke test)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="aiayn's and Eole's (default: bf16 where the CPU computes it in hardware, else fp32)")
    args = parse_args(parser)
    stop_children_on_signals()
    precision = resolve_precision(args.precision, torch.device("cpu"))
    if not args.minutes > 0:
        sys.exit("--minutes must be positive")
    if "aiayn" not in args.systems:
        sys.exit("aiayn must be among --systems: its run trains the shared vocabulary")
    require_precision(precision)
    absent = [str(PEER_ENVS[name][0]) for name in args.systems if name in PEER_ENVS and not PEER_ENVS[name][0].exists()]
    if absent:  # found in a misuse hunt: said only once aiayn had trained for --minutes
        sys.exit(f"quality_per_hour: {', '.join(absent)} missing: run `bash benchmarks/setup_train_peers.sh`, "
                 "or leave that peer out of --systems")
    replace_runs_folder(args.runs, args.force, lambda name: name in (*SYSTEMS, "pieces", "aiayn-train.log"))
    args.runs.mkdir(parents=True)
    torch.set_num_threads(args.threads)
    # What the steps in the budget depend on: this machine's matrix-product peak, on these threads
    # (of the precisions trained in only: bf16 products without hardware bf16 take minutes to time)
    peak = {p: round(matmul_peak_flops(torch.device("cpu"), p) / 1e12, 3) for p in sorted({precision, "fp32"})}
    print(f"matmul peak on {args.threads} threads: " + ", ".join(f"{p} {v} TFLOP/s" for p, v in peak.items()), flush=True)

    aiayn_run = args.runs / "aiayn"
    print(f"aiayn: training for {args.minutes:g} min...", flush=True)
    trained = {"aiayn": train_aiayn(aiayn_run, args.minutes, args.threads, precision)}
    model_config = json.loads((RunDir(aiayn_run).model_config).read_text())
    data = args.runs / "pieces"
    tokenizer = write_pieces(RunDir(aiayn_run).data, data)
    shape = ["--layers", model_config["n_layers"], "--d-model", model_config["d_model"], "--heads", model_config["n_heads"],
             "--d-ff", model_config["d_ff"], "--dropout", model_config["dropout"]]
    recipe = ["--label-smoothing", 0.1, "--max-tokens", DEMO_RECIPE["max_tokens"], "--warmup-steps", DEMO_RECIPE["warmup_steps"],
              "--lr-scale", DEMO_RECIPE["lr_scale"], "--seed", 1, "--save-every", SAVE_EVERY, "--keep-last", KEEP_LAST]
    for name in PEER_ENVS:
        if name in args.systems:
            print(f"{name}: training for {args.minutes:g} min...", flush=True)
            trained[name] = peer(name, ["train", "--data", str(data), "--out", str(args.runs / name), "--minutes", str(args.minutes),
                                        "--precision", peer_precision(name, precision), *map(str, shape + recipe)], args.threads)
            trained[name]["precision"] = peer_precision(name, precision)

    test = load_store(RunDir(aiayn_run).data).texts("test")[: args.test_sentences]
    references = [t for _, t in test]
    rows = {}
    for name in trained:
        print(f"{name}: decoding {len(test):,} test verses...", flush=True)
        if name == "aiayn":
            decode = dataclasses.replace(DECODE, precision=precision)
            result = score(Translator(Transformer.load(trained["aiayn"]["checkpoint"]), tokenizer, decode), test)
            decoded = {"seconds": result.seconds, "precision": precision}
            hypotheses = result.hypotheses
        else:
            out = args.runs / name / "test.hyp"
            source = args.runs / name / "test.src"
            source.write_text("".join(line + "\n" for line in (data / "test.src").read_text(encoding="utf-8").splitlines()[: len(test)]),
                              encoding="utf-8")
            decoded = peer(name, ["translate", "--model", trained[name]["checkpoint"], "--src", str(source),
                                  "--out", str(out), "--beam", str(DECODE.beam), "--alpha", str(DECODE.alpha),
                                  "--extra-len", str(DECODE.extra_len), "--precision", peer_precision(name, precision)],
                           args.threads)  # in the precision it trained in, as aiayn (found in review: fp32 against bf16)
            hypotheses = [tokenizer.decode([tokenizer.piece_to_id(p) for p in line.split()])
                          for line in out.read_text(encoding="utf-8").splitlines()]
        result = score_hypotheses(hypotheses, references)
        value, signature = result.bleu, result.signature
        seconds = decoded.get("decode_s") or decoded["seconds"]  # the decoder's own time where it reports one
        rows[name] = {**trained[name], "test_bleu": round(value, 2), "decode_s": round(seconds, 1),
                      "decode": {k: v for k, v in decoded.items() if k != "fairness_notes"},
                      "fairness_notes": decoded.get("fairness_notes", []), "signature": signature}
        print(f"{name}: {rows[name]['steps']:,} steps, test BLEU {value:.2f}, decoding {seconds:.0f} s", flush=True)

    suffix = "" if precision == "bf16" else f"-{precision}"
    write_results(args.out or RESULTS / f"quality-per-hour-{cpu_kind()}{suffix}.json", {
        "benchmark": "quality-per-hour", "command": command_line(), "machine": machine(torch.device("cpu"), args.threads),
        "matmul_peak_tflops": peak,
        "settings": {"minutes": args.minutes, "model": model_config, "recipe": DEMO_RECIPE, "decode": DECODE.__dict__,
                     "test_sentences": len(test),
                     # (found in review: said nowhere) the decoders batch alike only roughly
                     "decode_batches": f"aiayn: up to {DECODE.batch_tokens} source tokens × beam a batch; the peers: "
                                       "their harness's --batch-tokens 4096 source tokens"},
        "systems": rows,
    })


if __name__ == "__main__":
    main()
