"""Preprocessing throughput, disk size, and time to the first step and peak memory of
`aiayn train --data` with 1 and 2 torchrun processes, on corpora the size of WMT14 en-de.

The corpus is the built-in bible-en-es training split repeated to --pairs pairs (4.5M: WMT14
en-de's size), written as train.en / train.es with the Bible's own dev and test books. For each
size it runs `aiayn preprocess` once (base vocabulary, 37,000 tokens), then `aiayn train --data
--preset base --precision bf16` for 2 steps, with 1 and with 2 processes, --reps times in
interleaved order, each in a fresh run folder. Every process reports its own peak resident set
(VmHWM) at exit; "time to first step" is from launch to the start of step 1 (the moment step 1's
log record appears, less that step's own duration).

Encoding against a peer: on the --compare-pairs corpus, `aiayn preprocess --tokenizer` (encode and
write ids with the tokenizer already made) and OpenNMT-py 3.0.4's `onmt_build_vocab` with the
same SentencePiece model and as many threads (it tokenizes every pair and counts pieces; it
writes no ids: OpenNMT-py encodes again at every epoch of training), --reps times, interleaved.
The peer lives in benchmarks/.venv-peers (benchmarks/setup_preprocess_peers.sh); fairseq, whose
fairseq-preprocess would be the like-for-like peer, does not run on Python 3.11 (see there).

Writes results/data-scale-KIND.json (KIND: the CPU kind, aiayn.device.cpu_kind); docs/data.md
quotes the medians.

    python benchmarks/data_scale.py                                   # 1M and 4.5M pairs, 3 reps
    python benchmarks/data_scale.py --pairs 100000 --compare-pairs 100000 --reps 1 --work /tmp/quick
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

import torch

from aiayn.corpora import load_corpus
from common import (RESULTS, command_line, cpu_kind, machine, non_negative_int, or_exit, parse_args, positive_int,
                    require_precision, spread, write_results)

# Run by torchrun (or alone): aiayn's CLI, then this process's peak resident set, on every rank.
CHILD = Path(__file__).resolve().parent / "peak_rss_child.py"
ONMT_BUILD_VOCAB = Path(__file__).resolve().parent / ".venv-peers" / "bin" / "onmt_build_vocab"
TRAIN_ARGS = ["--preset", "base", "--precision", "bf16", "--max-steps", "2", "--max-tokens", "1000",
              "--log-every", "1", "--eval-every", "1000000", "--save-every", "1000000"]


def write_corpus(folder: Path, pairs: int) -> int:
    """train.en/train.es of `pairs` lines (the Bible's training verses, repeated), and its dev and
    test books; returns the bytes of the training text."""
    bible = load_corpus("bible-en-es")
    folder.mkdir(parents=True, exist_ok=True)
    train = bible.splits["train"]
    for side, lang in enumerate(("en", "es")):
        block = "".join(pair[side] + "\n" for pair in train)
        with open(folder / f"train.{lang}", "w", encoding="utf-8") as handle:
            for _ in range(pairs // len(train)):
                handle.write(block)
            handle.write("".join(pair[side] + "\n" for pair in train[: pairs % len(train)]))
        for split in ("dev", "test"):
            (folder / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in bible.splits[split]), encoding="utf-8")
    return sum((folder / f"train.{lang}").stat().st_size for lang in ("en", "es"))


def run_measured(argv: list[str], log: Path | None, threads: int) -> dict:
    """Run `argv`; every aiayn process in it prints "PEAK_MIB rank value". With `log`, watch it
    for step 1's record: the time from launch to the start of step 1."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first_step = None
    while process.poll() is None:
        if log is not None and first_step is None and log.exists():
            records = [json.loads(line) for line in log.read_text().splitlines() if line.strip().endswith("}")]
            step1 = next((r for r in records if r.get("step") == 1 and r.get("split") == "train"), None)
            if step1 is not None:
                seen = time.monotonic() - start
                first_step = {"start_s": seen - step1["elapsed_s"], "end_s": seen}
        time.sleep(0.02)
    out, err = process.communicate()
    wall = time.monotonic() - start
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed:\n{err[-2000:]}")
    peaks = {}
    for line in out.splitlines():
        if line.startswith("PEAK_MIB"):
            _, rank, value = line.split()
            peaks[int(rank)] = float(value)
    return {"wall_s": wall, "peak_mib": [peaks[r] for r in sorted(peaks)], "first_step": first_step}


def onmt_config(corpus: Path, model: Path, out: Path, threads: int) -> Path:
    """onmt_build_vocab's YAML: the corpus through the sentencepiece transform, one shared vocab."""
    config = out / "build_vocab.yaml"
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({  # JSON is YAML
        "save_data": str(out / "run"), "src_vocab": str(out / "vocab.shared"), "share_vocab": True,
        "overwrite": True, "n_sample": -1, "num_threads": threads,
        "src_subword_model": str(model), "tgt_subword_model": str(model),
        "data": {"corpus_1": {"path_src": str(corpus / "train.en"), "path_tgt": str(corpus / "train.es"),
                              "transforms": ["sentencepiece"], "weight": 1}},
    }))
    return config


def compare_encoding(work: Path, pairs: int, reps: int, threads: int) -> dict:
    """aiayn preprocess --tokenizer against onmt_build_vocab, interleaved, on one corpus."""
    corpus, data = work / f"corpus-{pairs}", work / f"data-{pairs}"
    seconds: dict[str, list[float]] = {"aiayn preprocess --tokenizer": [], "onmt_build_vocab": []}
    for rep in range(reps):
        again = work / f"again-{pairs}"
        argv = [sys.executable, str(CHILD), "preprocess", "--corpus", str(corpus), "--src-lang", "en", "--tgt-lang",
                "es", "--out", str(again), "--tokenizer", str(data), "--workers", str(threads), "--force"]
        seconds["aiayn preprocess --tokenizer"].append(run_measured(argv, None, threads)["wall_s"])
        config = onmt_config(corpus, data / "tokenizer.model", work / "onmt", threads)
        seconds["onmt_build_vocab"].append(run_measured([str(ONMT_BUILD_VOCAB), "-config", str(config)], None, threads)["wall_s"])
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in seconds.items()), flush=True)
    return {name: {"wall_s": spread(values), "pairs_per_s": pairs / spread(values)["median"]}
            for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=positive_int, nargs="+", default=[1_000_000, 4_500_000], help="corpus sizes")
    parser.add_argument("--reps", type=positive_int, default=3, help="training starts per size and process count")
    parser.add_argument("--compare-pairs", type=non_negative_int, default=1_000_000,
                        help="corpus size (one of --pairs) for the comparison with onmt_build_vocab; 0: none")
    parser.add_argument("--work", type=Path, default=None, help="folder for corpora and data (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="result file (default results/data-scale-KIND.json)")
    args = parse_args(parser)
    # Found in review: both were found out only after every corpus was preprocessed.
    if args.compare_pairs and args.compare_pairs not in args.pairs:
        parser.error("--compare-pairs must be one of --pairs")
    if args.compare_pairs and not ONMT_BUILD_VOCAB.exists():
        parser.exit(2, f"no {ONMT_BUILD_VOCAB}: run benchmarks/setup_preprocess_peers.sh, or --compare-pairs 0\n")
    require_precision("bf16")  # TRAIN_ARGS' (found in a misuse hunt: refused by aiayn train after every corpus was preprocessed)
    if args.work:  # the docstring's own --work /tmp/quick was a traceback where it did not exist yet
        or_exit(lambda: args.work.mkdir(parents=True, exist_ok=True))
    threads = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        sizes = {}
        for pairs in args.pairs:
            corpus = work / f"corpus-{pairs}"
            text_bytes = write_corpus(corpus, pairs)
            data = work / f"data-{pairs}"
            argv = [sys.executable, str(CHILD), "preprocess", "--corpus", str(corpus), "--src-lang", "en",
                    "--tgt-lang", "es", "--out", str(data), "--vocab-size", "37000", "--workers", str(threads)]
            measured = run_measured(argv, None, threads)
            manifest = json.loads((data / "manifest.json").read_text())
            kept = manifest["splits"]["train"]["pairs"]
            sizes[pairs] = {
                "train_text_bytes": text_bytes,
                "data_dir_bytes": sum(f.stat().st_size for f in data.iterdir()),
                "train_ids_bytes": (data / "train.bin").stat().st_size,
                "preprocess_wall_s": measured["wall_s"],
                "preprocess_pairs_per_s": pairs / measured["wall_s"],
                "preprocess_peak_mib": measured["peak_mib"][0],
                "train_pairs_kept": kept,
                "train": {},
            }
            print(f"{pairs:,} pairs: preprocess {measured['wall_s']:.0f} s ({pairs / measured['wall_s']:,.0f} pairs/s), "
                  f"peak {measured['peak_mib'][0]:,.0f} MiB, DATA_DIR {sizes[pairs]['data_dir_bytes'] / 2**20:,.0f} MiB",
                  flush=True)
        peers = None
        if args.compare_pairs:
            peers = {"pairs": args.compare_pairs, **compare_encoding(work, args.compare_pairs, args.reps, threads)}
        runs = {(pairs, nproc): [] for pairs in args.pairs for nproc in (1, 2)}
        for rep in range(args.reps):
            for (pairs, nproc), results in runs.items():
                run = work / f"run-{pairs}-{nproc}-{rep}"
                launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",  # a port of its own
                            "--local-addr", "127.0.0.1", "--nproc-per-node", str(nproc)] if nproc > 1 else [sys.executable]
                argv = launcher + [str(CHILD), "train", "--data", str(work / f"data-{pairs}"), "--out", str(run), *TRAIN_ARGS]
                measured = run_measured(argv, run / "log.jsonl", threads // nproc)
                results.append(measured)
                print(f"rep {rep + 1}: {pairs:,} pairs, {nproc} process(es): first step starts at "
                      f"{measured['first_step']['start_s']:.1f} s, peak {max(measured['peak_mib']):,.0f} MiB", flush=True)
                subprocess.run(["rm", "-rf", str(run)], check=True)  # ~1 GB of checkpoint each
        for (pairs, nproc), results in runs.items():
            sizes[pairs]["train"][f"{nproc}_processes"] = {
                "time_to_first_step_s": spread([r["first_step"]["start_s"] for r in results]),
                "time_to_end_of_step_1_s": spread([r["first_step"]["end_s"] for r in results]),
                "peak_mib_per_process": spread([p for r in results for p in r["peak_mib"]]),
                "runs": results,
            }
    kind = cpu_kind()
    out = args.out or RESULTS / f"data-scale-{kind}.json"
    write_results(out, {
        "command": command_line(),
        "machine": machine(torch.device("cpu"), threads),
        "cpu_kind": kind,
        "what": "aiayn preprocess (vocab 37,000, all cores) and aiayn train --data --preset base --precision bf16 "
                f"({' '.join(TRAIN_ARGS)}) on the Bible repeated to N pairs",
        "sizes": {str(k): v for k, v in sizes.items()},
        "encoding_vs_peer": peers,
    })


if __name__ == "__main__":
    main()
