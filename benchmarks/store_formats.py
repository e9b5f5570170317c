"""aiayn's DATA_DIR layout against an Arrow IPC file (what HF `datasets` stores) for the same ids.

The question `aiayn preprocess` had to answer: a flat id array + offsets + lengths read with
numpy.memmap (fairseq's and Megatron-LM's indexed datasets), or Arrow files with list<uint16>
columns, memory-mapped through pyarrow. Both are memory-mapped and hold the same numbers; this
command measures what training does with them: open the split and read the (source, target)
lengths of every pair (the batcher's input), and gather the ids of random batches (what each
step reads), plus the bytes on disk. --reps repetitions, interleaved, medians with the range.

    python benchmarks/store_formats.py DATA_DIR            # a folder made by aiayn preprocess
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from aiayn.batching import collate
from aiayn.store import load_store
from common import RESULTS, command_line, cpu_kind, machine, or_exit, parse_args, positive_int, spread, write_results

BATCH_PAIRS = 32  # pairs per gathered batch: WMT14 at 25,000 tokens holds ~800; 32 isolates per-pair cost
BATCHES = 200


def write_arrow(store, path: Path) -> None:
    """The train split as an Arrow IPC file with list<uint16> columns `src` and `tgt`."""
    split = store.split("train")
    lengths = np.asarray(split.lengths)
    starts = np.asarray(split.offsets[:-1])
    ids = np.asarray(split.ids)
    src_offsets = np.zeros(len(lengths) + 1, np.int64)
    tgt_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths[:, 0], out=src_offsets[1:])
    np.cumsum(lengths[:, 1], out=tgt_offsets[1:])
    position = np.repeat(starts, lengths[:, 0]) + (np.arange(src_offsets[-1]) - np.repeat(src_offsets[:-1], lengths[:, 0]))
    src_values = ids[position]
    position = np.repeat(starts + lengths[:, 0], lengths[:, 1]) + (np.arange(tgt_offsets[-1]) - np.repeat(tgt_offsets[:-1], lengths[:, 1]))
    tgt_values = ids[position]
    table = pa.table({
        "src": pa.LargeListArray.from_arrays(pa.array(src_offsets), pa.array(src_values)),
        "tgt": pa.LargeListArray.from_arrays(pa.array(tgt_offsets), pa.array(tgt_values)),
    })
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)


def aiayn_pass(folder: Path, batches: np.ndarray) -> tuple[float, float, int]:
    start = time.perf_counter()
    split = load_store(folder).split("train")
    lengths = np.asarray(split.lengths) + 1  # (N, 2), what make_batches reads
    opened = time.perf_counter() - start
    start = time.perf_counter()
    for rows in batches:
        collate([split[i] for i in rows.tolist()], 0, 1, 2)
    return opened, (time.perf_counter() - start) / len(batches), lengths.sum()


def arrow_pass(path: Path, batches: np.ndarray) -> tuple[float, float, int]:
    start = time.perf_counter()
    table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    src, tgt = table.column("src").combine_chunks(), table.column("tgt").combine_chunks()
    lengths = np.stack([pc.list_value_length(src).to_numpy(), pc.list_value_length(tgt).to_numpy()], 1) + 1
    opened = time.perf_counter() - start
    start = time.perf_counter()
    for rows in batches:
        chosen_src, chosen_tgt = src.take(pa.array(rows)), tgt.take(pa.array(rows))
        pairs = [(chosen_src[i].values.to_numpy(), chosen_tgt[i].values.to_numpy()) for i in range(len(rows))]
        collate(pairs, 0, 1, 2)
    return opened, (time.perf_counter() - start) / len(batches), lengths.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parse_args(parser, inputs=lambda args: [args.data_dir])
    store = or_exit(lambda: load_store(args.data_dir))
    pairs = store.manifest["splits"]["train"]["pairs"]
    rng = np.random.default_rng(0)
    batches = rng.integers(0, pairs, (BATCHES, BATCH_PAIRS))
    with tempfile.TemporaryDirectory() as tmp:
        arrow = Path(tmp) / "train.arrow"
        write_arrow(store, arrow)
        sizes = {"aiayn": sum((args.data_dir / f"train{s}").stat().st_size for s in (".bin", ".idx.npy", ".len.npy")),
                 "arrow": arrow.stat().st_size}
        timings = {"aiayn": {"open_s": [], "batch_ms": []}, "arrow": {"open_s": [], "batch_ms": []}}
        checks = {}
        for _ in range(args.reps):
            for name, run in (("aiayn", lambda: aiayn_pass(args.data_dir, batches)), ("arrow", lambda: arrow_pass(arrow, batches))):
                opened, per_batch, total = run()
                timings[name]["open_s"].append(opened)
                timings[name]["batch_ms"].append(per_batch * 1000)
                checks[name] = int(total)
    assert checks["aiayn"] == checks["arrow"], checks  # the same lengths from both
    results = {
        "command": command_line(),
        "machine": machine(torch.device("cpu"), torch.get_num_threads()),
        "cpu_kind": cpu_kind(),
        "what": f"train split of {args.data_dir} ({pairs:,} pairs): open + all lengths; gather + collate "
                f"{BATCHES} random batches of {BATCH_PAIRS} pairs",
        "bytes": sizes,
        "open_and_lengths_s": {k: spread(v["open_s"]) for k, v in timings.items()},
        "batch_ms": {k: spread(v["batch_ms"]) for k, v in timings.items()},
    }
    write_results(args.out or RESULTS / f"store-formats-{cpu_kind()}.json", results)
    for name in timings:
        print(f"{name:6s} {sizes[name] / 2**20:8.1f} MiB  open+lengths {results['open_and_lengths_s'][name]['median']:.3f} s  "
              f"batch {results['batch_ms'][name]['median']:.2f} ms")


if __name__ == "__main__":
    main()
