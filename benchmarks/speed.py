"""Training and decoding speed of aiayn and its peers, as ratios to aiayn.

Cases (system × precision × task), each measured in a fresh process (one_case.py) and repeated
--reps times in interleaved order: repetition 1 of every case, then repetition 2, ..., so that
slow drifts of the machine (heat, other load) spread over all systems alike.

    train    target tokens/s of Adam steps, label smoothing 0.1, on the fixed batch (64 pairs of
             32 + 32 tokens) and on real batch shapes: token budgets cut by aiayn's batching from
             the sentence lengths of the built-in corpus (systems.corpus_shapes), the same batches
             for every system, tokens counted on real (non-pad) targets; achieved TFLOP/s and its
             share of the matmul peak of the same precision. Budgets: 2,000 and 25,000 (the
             paper's per-step batch) on a CPU; on a GPU 3,125 (the paper's per-GPU share: 25,000
             over 8 GPUs) and 25,000
    decode   output tokens/s for 64 sentences of 32 tokens, every output forced to 32 tokens,
             beam 4 and greedy; --sentences 1 decodes one sentence a call instead, as a server
             answers a lone client, over more calls (at least 16 sentences timed a process)
    peak     the matmul FLOP/s roof of each precision, measured among the other cases

--models base big measures Table 3's two shapes (default base). Precisions: fp32 and bf16 on a
CPU (int8 decoding comes with fp32); on a GPU tf32 (fp32 with TF32 matrix products) and bf16
(fp16 and int8 decoding come with bf16: aiayn decodes in fp16, CTranslate2 in fp16 and
int8_float16).

Writes results/speed-DEVICE.json (the progress after every case into speed-DEVICE.running.json,
so that a stopped run keeps what it measured and leaves the last finished run's file whole): every
repetition, the median and range of each case, and the ratio of its median to aiayn's for the
same task, model and precision (aiayn's bf16, then fp32, where aiayn lacks the precision).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

import systems
from aiayn.device import fast_bf16
from common import (PEER_ENVS, command_line, default_output, default_threads, device_or_exit, machine, parse_args,
                    peak_share, positive_int, require_precision, run_case, spread, write_results)

PRECISIONS = ("fp32", "tf32", "bf16")  # of training and the peak; decoding adds its own (make_cases)


@dataclass(frozen=True)
class Settings:
    reps: int  # repetitions of every case, each in a fresh process
    rows: int  # sentence pairs per training batch
    train_warmup: int
    train_steps: int  # timed
    sentences: int  # decoded per call
    decode_warmup: int
    decode_calls: int  # timed
    # Real batch shapes: (token budget, warm-up steps, timed batches), each batch timed once
    budgets: tuple[tuple[int, int, int], ...]


FULL = Settings(reps=3, rows=64, train_warmup=2, train_steps=5, sentences=64, decode_warmup=1, decode_calls=1,
                budgets=((2000, 2, 8), (25000, 1, 3)))
# On a GPU a step of a budget's batch takes milliseconds: more of them, and the paper's per-GPU share.
CUDA = Settings(reps=3, rows=64, train_warmup=3, train_steps=10, sentences=64, decode_warmup=1, decode_calls=3,
                budgets=((3125, 3, 12), (25000, 3, 8)))
# --sentences below a setting's: each process times at least this many sentences, over more calls.
MIN_TIMED_SENTENCES = 16
# A smoke test of every case (CTranslate2 conversion included): the numbers mean nothing.
QUICK = Settings(reps=1, rows=4, train_warmup=1, train_steps=1, sentences=4, decode_warmup=1, decode_calls=1,
                 budgets=((200, 1, 2),))


@dataclass(frozen=True)
class Case:
    task: str  # train, decode or peak
    system: str  # one of systems.SYSTEMS, or "matmul" for the peak
    precision: str
    beam: Optional[int] = None  # decode only
    compile: bool = False  # aiayn under torch.compile
    bf16_weights: bool = False  # aiayn with bf16 weights and fp32 master weights (TrainConfig.bf16_weights)
    cuda_graphs: bool = False  # aiayn decoding with each step one CUDA graph (DecodeConfig.cuda_graphs)
    budget: Optional[int] = None  # train only: real batch shapes of this token budget; None: the fixed batch
    model: str = "base"  # Table 3's row (systems.MODELS)

    @property
    def label(self) -> str:
        system = self.system + (" (compiled)" if self.compile else "") + (" (bf16 weights)" if self.bf16_weights else "") \
            + (" (CUDA graphs)" if self.cuda_graphs else "")
        model = f" {self.model}" if self.task != "peak" and self.model != "base" else ""
        beam = f" beam {self.beam}" if self.beam else ""
        batches = f" {self.budget}-token batches" if self.budget else ""
        return f"{self.task} {system}{model} {self.precision}{beam}{batches}"

    def args(self, settings: Settings, device: torch.device, threads: int, ct2_dirs: dict[tuple[str, str], Path],
             shape_files: dict[int, Path]) -> list[str]:
        """The command line of one_case.py (or of the peer's harness) that measures this case."""
        if self.task == "train":
            batches = (["--shapes", shape_files[self.budget], "--warmup", budget_warmup(settings, self.budget)]
                       if self.budget else
                       ["--rows", settings.rows, "--warmup", settings.train_warmup, "--steps", settings.train_steps])
        if self.system in PEER_ENVS:
            precision = ["--precision", "fp32", "--tf32"] if self.precision == "tf32" else ["--precision", self.precision]
            on = ["--device", device.type] if device.type != "cpu" else []  # older harnesses know no --device
            model = ["--model", self.model] if self.model != "base" else []
            return [str(a) for a in ("speed", *precision, *on, *model, *batches, "--src-len", systems.SRC_LEN,
                                     "--tgt-len", systems.TGT_LEN, "--vocab", systems.VOCAB, "--threads", threads)]
        common = ["--device", str(device), "--threads", str(threads), "--model", self.model]
        if self.task == "peak":
            return [*common, "peak", "--precision", self.precision]
        args = [*common, self.task, "--system", self.system, "--precision", self.precision]
        if self.task == "train":
            args += batches
            args += ["--compile"] if self.compile else []
            args += ["--bf16-weights"] if self.bf16_weights else []
        else:
            args += ["--beam", self.beam, "--sentences", settings.sentences,
                     "--warmup", settings.decode_warmup, "--calls", settings.decode_calls]
            args += ["--cuda-graphs"] if self.cuda_graphs else []
            if self.system == "ctranslate2":
                args += ["--ct2-dir", ct2_dirs[self.model, self.precision]]
        return [str(a) for a in args]


def budget_warmup(settings: Settings, budget: int) -> int:
    return next(warmup for b, warmup, _ in settings.budgets if b == budget)


def default_precisions(device: torch.device) -> tuple[str, ...]:
    """fp32 and bf16 on a CPU; on a GPU fp32 with TF32 products, as its users train, and bf16."""
    return ("tf32", "bf16") if device.type == "cuda" else ("fp32", "bf16")


def make_cases(tasks: list[str], names: list[str], device: torch.device, compile: bool,
               budgets: list[Optional[int]], precisions: tuple[str, ...] = ("fp32", "bf16"),
               models: tuple[str, ...] = ("base",)) -> list[Case]:
    """`budgets`: None for the fixed batch, or the token budget of real batch shapes. bf16 only
    where the device computes it in hardware (aiayn refuses it elsewhere, and every system would
    run it many times slower than fp32); tf32 only on a GPU. `precisions`: those to measure (int8
    decoding comes with fp32 on a CPU, fp16 and int8 with bf16 on a GPU). `compile`: aiayn's
    compiled step too, at every budget and precision."""
    ours = tuple(p for p in precisions if (p != "bf16" or fast_bf16(device)) and (p != "tf32" or device.type == "cuda"))
    cases = [Case("peak", "matmul", p) for p in ours]
    if "train" in tasks:
        trainable = [s for s in names if s in systems.TRAINABLE]
        for model in models:
            for budget in budgets:
                cases += [Case("train", s, p, budget=budget, model=model) for s in trainable for p in ours]
                cases += [Case("train", s, p, budget=budget, model=model) for s in names if s in PEER_ENVS
                          and device.type in systems.PEER_DEVICES[s] for p in systems.PEER_PRECISIONS[s] if p in ours]
                # bf16 weights (Eole's pure bf16 is the peer's counterpart): the fixed batch, and on
                # a GPU, where autocast's casts are a share of the step, every budget
                if "aiayn" in names and "bf16" in ours and (budget is None or device.type == "cuda"):
                    cases += [Case("train", "aiayn", "bf16", bf16_weights=True, budget=budget, model=model)]
                if compile and "aiayn" in names:
                    cases += [Case("train", "aiayn", p, compile=True, budget=budget, model=model) for p in ours]
    if "decode" in tasks:
        if device.type == "cuda":
            asked = (*ours, "fp16", "int8") if "bf16" in ours else ours
        else:
            asked = (*ours, "int8") if "fp32" in ours else ours
        as_torch = tuple("fp32" if p == "tf32" else p for p in ours)  # tf32 decoding is not measured: fp32
        for model in models:
            for beam in (4, 1):
                for s in names:
                    if s == "ctranslate2":  # its own precisions, as many as asked for (bf16 where it has it)
                        decoded = [p for p in systems.ctranslate2_precisions(device) if p in asked]
                    elif s == "aiayn":  # int8 weights on a CPU (aiayn.inference.inference_copy), fp16 on a GPU
                        extra = "int8" if device.type == "cpu" else "fp16"
                        decoded = [*as_torch, *([extra] if extra in asked else [])]
                    elif s in systems.SYSTEMS:
                        decoded = as_torch
                    else:
                        decoded = []  # the peers' harnesses measure training only
                    cases += [Case("decode", s, p, beam, model=model) for p in dict.fromkeys(decoded)]
                    if s == "aiayn" and device.type == "cuda" and "bf16" in decoded:  # aiayn.graphs
                        cases += [Case("decode", s, "bf16", beam, model=model, cuda_graphs=True)]
    return cases


def summarize(cases: list[Case], runs: list[dict]) -> list[dict]:
    """Per case: median and range of each metric over the repetitions that succeeded; the ratio
    of its median to aiayn's (same task, beam and precision; fp32 where aiayn lacks the
    precision); for training, the share of the matmul peak measured in the same run."""
    rows = []
    for case in cases:
        tried = [r for r in runs if r["case"] == asdict(case)]
        ok = [r for r in tried if "error" not in r]
        row = {**asdict(case), "label": case.label, "reps": len(ok), "errors": len(tried) - len(ok)}
        for metric in ("tokens_per_s", "tflops", "peak_mib", "compiles", "compile_s"):
            values = [r[metric] for r in ok if r.get(metric) is not None]
            if values:
                row[metric] = spread(values)
        if ok and "parameters" in ok[0]:
            row["parameters"] = ok[0]["parameters"]
        rows.append(row)

    def find(metric: str, **key) -> Optional[dict]:
        """The summary row matching `key` that has `metric`."""
        return next((r for r in rows if metric in r and all(r[k] == v for k, v in key.items())), None)

    for row in rows:
        if row["task"] == "peak" or "tokens_per_s" not in row:
            continue
        aiayn = dict(task=row["task"], system="aiayn", compile=False, bf16_weights=False, cuda_graphs=False, beam=row["beam"],
                     budget=row["budget"], model=row["model"])
        ref = (find("tokens_per_s", **aiayn, precision=row["precision"]) or find("tokens_per_s", **aiayn, precision="bf16")
               or find("tokens_per_s", **aiayn, precision="fp32"))
        if ref:
            row["reference"] = ref["label"]
            row["reference_precision"] = ref["precision"]
            row["ratio"] = row["tokens_per_s"]["median"] / ref["tokens_per_s"]["median"]
            if "peak_mib" in row and "peak_mib" in ref:
                row["memory_ratio"] = row["peak_mib"]["median"] / ref["peak_mib"]["median"]
        roof = find("tflops", task="peak", precision=row["precision"])
        if row["task"] == "train" and roof and "tflops" in row:
            row["peak_fraction"] = peak_share(row["tflops"], roof["tflops"])
    return rows


def describe_shapes(shapes: list[systems.Shape]) -> dict:
    """What the timed batches of one budget hold: rows, longest source and target, real and
    padded target tokens of each, and the shapes themselves."""
    return {
        "rows": [len(s["tgt"]) for s in shapes],
        "longest": [[max(s["src"]), max(s["tgt"])] for s in shapes],
        "target_tokens": [sum(s["tgt"]) for s in shapes],
        "padded_target_tokens": [len(s["tgt"]) * max(s["tgt"]) for s in shapes],
        "shapes": shapes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_int, default=default_threads(), help="for every system (default: all cores)")
    parser.add_argument("--reps", type=positive_int, help=f"repetitions of every case (default {FULL.reps})")
    parser.add_argument("--tasks", nargs="+", choices=("train", "decode"), default=["train", "decode"])
    parser.add_argument("--systems", nargs="+", choices=(*systems.SYSTEMS, *PEER_ENVS), default=list(systems.SYSTEMS),
                        help="eole and onmt (training only) need `bash benchmarks/setup_train_peers.sh`")
    parser.add_argument("--peer-python", nargs="+", default=[], metavar="PEER=PYTHON",
                        help="run a peer's harness with this interpreter instead of its environment's (a machine "
                             "where the peer is installed another way), e.g. eole=python3")
    parser.add_argument("--models", nargs="+", choices=systems.MODELS, default=["base"], help="Table 3's shapes (default base)")
    parser.add_argument("--compile", action="store_true", help="also train aiayn under torch.compile")
    parser.add_argument("--batches", nargs="+", help="training batches: 'fixed' (64 pairs of 32 + 32 tokens) and/or the "
                        "token budgets of real batch shapes (default: fixed and every budget of the settings)")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                        help="those to measure (default: fp32 and bf16 on a CPU, tf32 and bf16 on a GPU; int8 "
                             "decoding comes with fp32 on a CPU, fp16 and int8 with bf16 on a GPU)")
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="only the cases whose label holds one of these, "
                        "e.g. 'CUDA graphs' ctranslate2 (the matmul peak is always measured)")
    parser.add_argument("--sentences", type=positive_int, help=f"sentences decoded per call (default {FULL.sentences}); with "
                        f"fewer, each process times enough calls to decode {MIN_TIMED_SENTENCES} at least")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: checks that every case runs")
    parser.add_argument("--out", type=Path, help="result file (default results/speed-DEVICE.json)")
    args = parse_args(parser)

    needed = {"marian": "transformers", "ctranslate2": "ctranslate2"}
    missing = [needed[s] for s in args.systems if s in needed and importlib.util.find_spec(needed[s]) is None]
    if missing:
        sys.exit(f"{', '.join(missing)} not installed: run `bash benchmarks/setup.sh` and use benchmarks/.venv/bin/python")
    peer_python = {}
    for given in args.peer_python:
        peer, _, python = given.partition("=")
        if peer not in PEER_ENVS or not python:
            parser.error(f"--peer-python takes PEER=PYTHON with PEER one of {', '.join(PEER_ENVS)}, not {given!r}")
        if shutil.which(python) is None:
            parser.error(f"--peer-python {given}: {python} is not an executable")
        peer_python[peer] = Path(python)
    absent = [str(PEER_ENVS[s][0]) for s in args.systems if s in PEER_ENVS and s not in peer_python
              and not PEER_ENVS[s][0].exists()]
    if absent:
        sys.exit(f"{', '.join(absent)} missing: run `bash benchmarks/setup_train_peers.sh`")
    device = device_or_exit(args.device)
    precisions = tuple(args.precisions or default_precisions(device))
    if "tf32" in precisions and device.type != "cuda":
        parser.error("tf32 is a CUDA GPU's format; use fp32 on a CPU")
    if args.precisions:  # asked for, not left out in silence (found in a misuse hunt: --precisions bf16 on a CPU
        require_precision(*(p for p in precisions if p != "tf32"), device=device)  # without it wrote no case, exit 0)
    settings = QUICK if args.quick else CUDA if device.type == "cuda" else FULL
    if args.reps:
        settings = Settings(**{**asdict(settings), "reps": args.reps})
    if args.sentences is not None:
        if args.sentences < 1:
            parser.error("--sentences takes a positive number")
        calls = max(settings.decode_calls, -(-MIN_TIMED_SENTENCES // args.sentences))
        # a call of few sentences meets few of the row counts oneDNN makes kernels for: one more untimed
        warmup = max(settings.decode_warmup, 2 if args.sentences < settings.sentences else 1)
        settings = Settings(**{**asdict(settings), "sentences": args.sentences, "decode_calls": calls,
                               "decode_warmup": warmup})
    known = [str(b) for b, _, _ in settings.budgets]
    if any(b not in ("fixed", *known) for b in args.batches or []):
        parser.error(f"--batches takes fixed and the budgets {', '.join(known)}")
    budgets = [None if b == "fixed" else int(b) for b in args.batches or ["fixed", *known]]
    settings = Settings(**{**asdict(settings), "budgets": tuple(b for b in settings.budgets if b[0] in budgets)})
    cases = make_cases(args.tasks, args.systems, device, args.compile, budgets, precisions, tuple(args.models))
    if args.only:
        cases = [c for c in cases if c.task == "peak" or any(text in c.label for text in args.only)]
        if all(c.task == "peak" for c in cases):
            parser.error(f"--only {' '.join(args.only)}: no case's label holds any of these")
    runs = []
    peer_notes: dict[str, list[str]] = {}  # what each peer's harness says differs from the common shape
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-") as scratch:
        shapes, shape_files = {}, {}  # by budget: the batch shapes every system trains on, and their file
        if "train" in args.tasks and settings.budgets:
            lengths = systems.corpus_lengths(Path(scratch))
            for budget, _, count in settings.budgets:
                shapes[budget] = systems.corpus_shapes(lengths, budget, count)
                shape_files[budget] = Path(scratch, f"shapes-{budget}.json")
                shape_files[budget].write_text(json.dumps(shapes[budget]))
        ct2_dirs = {}  # (model, precision) -> converted model
        ct2_types = systems.CT2_TYPES[device.type]
        for model in args.models:
            ct2_precisions = sorted({c.precision for c in cases if c.system == "ctranslate2" and c.model == model})
            if ct2_precisions:
                # Converted once, outside any measurement, from the Marian runs' weights (seed 0).
                converted = run_case(["--threads", str(args.threads), "--model", model, "convert", "--out",
                                      str(Path(scratch, model)), "--quantizations", *(ct2_types[p] for p in ct2_precisions)],
                                     args.threads)
                if "error" in converted:
                    sys.exit(f"CTranslate2 conversion failed:\n{converted['error']}")
                ct2_dirs.update({(model, p): Path(converted[ct2_types[p]]) for p in ct2_precisions})
        out = args.out or default_output("speed", device, args.quick)
        progress = out.with_name(out.stem + ".running.json")  # out itself is replaced only by a finished run

        def results() -> dict:
            return {
                "benchmark": "speed",
                "command": command_line(),
                "quick": args.quick,
                "machine": machine(device, args.threads),
                "settings": {**asdict(settings), "src_len": systems.SRC_LEN, "tgt_len": systems.TGT_LEN,
                             "out_len": systems.OUT_LEN, "vocab": systems.VOCAB,
                             "label_smoothing": systems.LABEL_SMOOTHING, "corpus": systems.CORPUS},
                "batch_shapes": {str(budget): describe_shapes(s) for budget, s in shapes.items()},
                "fairness_notes": list(systems.FAIRNESS_NOTES) + [f"{systems.PEER_NAMES[p]}: {n}"
                                                                  for p, ns in peer_notes.items() for n in ns],
                "cases": summarize(cases, runs),
                "runs": runs,
            }

        for rep in range(settings.reps):
            # The order rotated by one case each repetition: a machine that slows as a run goes on
            # (shared cores, heat) then weighs on every system alike, not on the ones run last
            # (found in review: one order every time, the peak and aiayn first).
            shift = rep % len(cases) if cases else 0
            for case in cases[shift:] + cases[:shift]:
                peer = case.system if case.system in PEER_ENVS else None
                result = run_case(case.args(settings, device, args.threads, ct2_dirs, shape_files), args.threads, peer,
                                  peer_python.get(peer))
                if peer:
                    peer_notes[peer] = result.pop("fairness_notes", peer_notes.get(peer, []))
                    if "tokens_per_s" in result:  # the same model FLOPs as one_case.train counts
                        result["tflops"] = systems.training_tflops(result["tokens_per_s"], shapes.get(case.budget),
                                                                   systems.model_config(case.model))
                runs.append({"case": asdict(case), "rep": rep, **result})
                shown = result.get("error") or ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float))
                print(f"[{rep + 1}/{settings.reps}] {case.label}: {shown}", flush=True)
                write_results(progress, results(), quiet=True)  # after every case: a stopped run keeps what it measured
    write_results(out, results())
    progress.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
