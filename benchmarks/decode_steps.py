"""What bounds continuous batching on this machine: the time of one decoding step of
`aiayn.translate.ContinuousDecoding` with 1 and with N sentences decoding (beam 4), and of one
sentence joining, on test verses of bible-en-es, in process (no HTTP), with oneDNN's kernel
cache sized as `aiayn serve` sizes it.

With N clients each waiting for its answer before sending the next text, a server at best
answers N sentences in the time one step of N takes times the steps of a sentence, against one
sentence in the steps of one: its throughput over one-at-a-time is at most
N × step(1) / (step(N) + joins per step × join). The script reports that ceiling beside the
measured times, and the machine's bf16 (or fp32) matmul peak, which bounds step(N).

With --beside K, each repetition also times the same while K other processes decode `live`
sentences each, as the other workers of `aiayn serve --workers K+1` do under load: cores that
share caches and memory slow each other. A server's one-at-a-time client keeps one worker busy
and the others idle, so the ceiling of K+1 workers is (K+1) × N × step(1) alone / (step(N) +
joins per step × join) beside them.

    python benchmarks/decode_steps.py runs/demo60 --precision bf16
    python benchmarks/decode_steps.py runs/demo --precision int8   # where bf16 is refused (an AVX2-only CPU)
    python benchmarks/decode_steps.py runs/demo --precision bf16 --live 8 --threads 1   # one of 2 workers
    python benchmarks/decode_steps.py runs/demo --precision bf16 --live 8 --threads 1 --beside 1
    python benchmarks/decode_steps.py runs/demo --precision bf16 --profile   # and where a step's time goes

It also reports what the arithmetic allows: a step of N sentences does at least the matrix products
of the (N - 1) × beam rows it adds to a step of one, and they take at least their FLOPs
(aiayn.flops.decoder_step_flops, the linear maps alone) over the matmul peak. So no search whose step
of one sentence is as fast as this one's gets past N × step(1) / (step(1) + that time), joins free;
a faster step of one lowers that bound, it never raises it. --profile adds torch.profiler's
account of a step and of a join, one sentence and N decoding, by operator (own CPU time), and the
Python between operators.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from aiayn.config import DECODE_PRESETS
from aiayn.corpora import load_corpus
from aiayn.device import matmul_peak_flops
from aiayn.flops import decoder_step_flops
from aiayn.kernel_cache import SERVING_KERNEL_CACHE_CAPACITY, bound_kernel_cache
from aiayn.translate import ContinuousDecoding, Translator
from common import (RESULTS, command_line, cpu_kind, default_threads, machine, non_negative_int, or_exit, parse_args,
                    positive_int, spread, write_results)
from serve_load import peak_precision


def decode(translator: Translator, sources: list[list[int]], live: int, marked: bool = False,
           decoding: Optional[ContinuousDecoding] = None, watch: Callable[[], None] = lambda: None) -> dict:
    """Decode `sources` keeping `live` sentences in the search (a finished one is replaced by the
    next at once, as N clients would); per-step and per-join seconds. `marked`: each join and step
    is a profiler region of that name. `decoding`: the search to use (a fresh one by default);
    `watch` is called before each step, outside its time."""
    decoding = decoding or ContinuousDecoding(translator.model, translator.decode)
    steps, joins, waiting = [], [], list(enumerate(sources))
    region = record_function if marked else lambda name: nullcontext()
    while waiting or decoding.live:
        room = min(live - decoding.live, len(waiting))
        if room:
            began = time.perf_counter()
            with region("join"):
                decoding.join([ids for _, ids in waiting[:room]], [key for key, _ in waiting[:room]], translator.decode.alpha)
            joins.append((time.perf_counter() - began, room))
            waiting = waiting[room:]
        watch()
        began = time.perf_counter()
        with region("step"):
            decoding.step()
        steps.append(time.perf_counter() - began)
    return {"step_ms": statistics.median(steps) * 1000, "steps": len(steps), "joins": len(joins),
            "join_ms": statistics.median(seconds for seconds, _ in joins) * 1000}


def occupancy(translator: Translator, sources: list[list[int]], live: int) -> dict:
    """What the steps of `live` sentences read against what they need, from one untimed decode.
    Every row writes its next keys at the same column, so a sentence that joined later is padded
    on the left (aiayn.cache): the self-attention buffers are as wide as the oldest sentence has
    decoded, while the mean row has written fewer columns; the memories are as wide as the longest
    source. And the beams' reorder: a step's k new beams of a sentence come from some distinct
    parents; were each parent's first child written in its parent's row, only the others would
    be copied ("rows kept in place")."""
    decoding = ContinuousDecoding(translator.model, translator.decode)
    reorder, parents = decoding.search.reorder, collections.Counter()

    def counting(rows: torch.Tensor, sentences: torch.Tensor, beam: int) -> None:
        parents.update(len(set(beams)) for beams in rows.view(-1, beam).tolist())
        reorder(rows, sentences, beam)

    decoding.search.reorder = counting
    widths = []

    def measure() -> None:
        cache = decoding.state.cache
        if decoding.live == live and cache.length:
            memory = cache.cross[0][0].size(2)
            written = cache.length - cache.start if cache.start is not None else torch.tensor(cache.length)  # (B,)
            source = cache.memory_mask.sum(-1).float().mean() if cache.memory_mask is not None else memory
            widths.append((cache.length, float(written.float().mean()), memory, float(source)))

    decode(translator, sources, live, decoding=decoding, watch=measure)
    beam, choices = translator.decode.beam, sum(parents.values())
    self_width, written, memory_width, source = (statistics.mean(column) for column in zip(*widths))
    return {"self_width": self_width, "columns_written": written, "memory_width": memory_width,
            "source_length": source, "rows_kept_in_place": sum(n * c for n, c in parents.items()) / (beam * choices)}


def ceiling(alone: dict, many: dict, live: int) -> float:
    """live × step(1) / (step(live) + joins per step × join): one search's rate over one sentence's."""
    return live * alone["step_ms"] / (many["step_ms"] + many["joins"] / many["steps"] * many["join_ms"])


def arithmetic_bound(alone: dict, live: int, beam: int, row_flops: int, peak: float) -> float:
    """live × step(1) / (step(1) + the products of the (live - 1) × beam rows added, at the peak)."""
    return live * alone["step_ms"] / (alone["step_ms"] + (live - 1) * beam * row_flops / peak * 1000)


def profiled(translator: Translator, sources: list[list[int]], live: int) -> list[str]:
    """torch.profiler over one decode of `sources` with `live` sentences at once: a step's and a
    join's operators by their own CPU time, and the Python between them (the region's own time,
    which holds the profiler's own cost per operator: the profiled step is slower than the timed one)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        counts = decode(translator, sources, live, marked=True)
    own = {"step": collections.Counter(), "join": collections.Counter()}
    for event in prof.events():
        region = event
        while region is not None and region.name not in own:
            region = region.cpu_parent
        if region is not None:
            own[region.name]["(Python between operators)" if region is event else event.name] += event.self_cpu_time_total
    lines = []
    for name, count in (("step", counts["steps"]), ("join", counts["joins"])):
        total = sum(own[name].values())
        lines.append(f"{name}, {live} sentence{'s' * (live > 1)} decoding: {count} of them, "
                     f"{total / count / 1e3:.2f} ms each under the profiler")
        lines += [f"  {op[:60]:<60} {us / count / 1e3:>7.3f} ms {us / total:>6.1%}" for op, us in own[name].most_common(14)]
    return lines


def start_beside(count: int) -> list[subprocess.Popen]:
    """`count` copies of this command decoding without end (--busy), each once it has warmed up."""
    argv = [arg for arg in sys.argv[1:] if arg != "--busy"]
    others = [subprocess.Popen([sys.executable, __file__, *argv, "--busy"], stdout=subprocess.PIPE, text=True)
              for _ in range(count)]
    for other in others:
        if other.stdout.readline().strip() != "ready":
            stop(others)
            sys.exit("decode_steps: a process decoding beside did not start (its error is above)")
    return others


def stop(others: list[subprocess.Popen]) -> None:
    for other in others:
        other.kill()
        other.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "int8"])
    parser.add_argument("--live", type=positive_int, default=16, help="sentences decoding at once (default 16, as 16 clients)")
    parser.add_argument("--threads", type=positive_int, default=default_threads(),
                        help="threads (default: every core; 1 is one worker of `aiayn serve --workers N`)")
    parser.add_argument("--sentences", type=positive_int, default=160)
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--beside", type=non_negative_int, default=0, metavar="K",
                        help="also time each case with K other processes decoding `live` sentences beside")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one decode with 1 and with `live` sentences (where a step's time goes)")
    parser.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)  # one of those K: decode until killed
    parser.add_argument("--out", type=Path)
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    if not args.run_dir.exists():
        parser.exit(2, f"error: {args.run_dir} does not exist\n")
    if args.live > args.sentences:  # (found in a misuse hunt: a traceback once every repetition was timed)
        parser.exit(2, f"error: --live {args.live} is more than --sentences {args.sentences}: {args.live} never decode at once\n")
    torch.set_num_threads(args.threads)
    bound_kernel_cache(SERVING_KERNEL_CACHE_CAPACITY)  # as `aiayn serve` does, before the first product
    settings = dataclasses.replace(DECODE_PRESETS["translate"], precision=args.precision)
    translator = or_exit(lambda: Translator.load(args.run_dir, decode=settings))  # a folder of no model: one line
    verses = [source for source, _ in load_corpus("bible-en-es").splits["test"]]
    random.Random(0).shuffle(verses)
    sources = translator.tokenizer.encode_batch(verses[: args.sentences])
    decode(translator, sources[:20], args.live)  # warm-up
    if args.busy:
        parent = os.getppid()
        print("ready", flush=True)
        while os.getppid() == parent:  # until killed, or until the measuring process has gone (found in a misuse
            decode(translator, sources, args.live)  # hunt: a SIGTERM'd run left its --beside processes decoding forever)
        return
    reps = []
    for rep in range(args.reps):  # interleaved: one sentence at a time, then `live` at once (then beside others)
        alone, many = decode(translator, sources, 1), decode(translator, sources, args.live)
        reps.append({"one": alone, "live": many, "ceiling": ceiling(alone, many, args.live)})
        print(f"rep {rep + 1}: step {alone['step_ms']:.2f} ms with 1 sentence, {many['step_ms']:.2f} ms with "
              f"{args.live}; join {many['join_ms']:.2f} ms, {many['joins'] / many['steps']:.2f} a step; "
              f"ceiling {reps[-1]['ceiling']:.2f}×", flush=True)
        if args.beside:
            others = start_beside(args.beside)
            try:
                one, many = decode(translator, sources, 1), decode(translator, sources, args.live)
            finally:
                stop(others)
            reps[-1].update(one_beside=one, live_beside=many, ceiling_beside=ceiling(alone, many, args.live))
            print(f"  beside {args.beside}: step {one['step_ms']:.2f} ms with 1, {many['step_ms']:.2f} ms with "
                  f"{args.live}; join {many['join_ms']:.2f} ms; ceiling {reps[-1]['ceiling_beside']:.2f}× a "
                  f"process, {(args.beside + 1) * reps[-1]['ceiling_beside']:.2f}× all", flush=True)
    products = peak_precision(args.precision)  # (int8: the fp32 peak, no roof of int8 products: see below)
    peak = matmul_peak_flops(torch.device("cpu"), products)
    row_flops = decoder_step_flops(translator.model.config, 0, 0)  # the linear maps alone: a lower bound
    bounded = args.precision != "int8"  # int8 products pass the fp32 peak: it bounds nothing (found in review)
    for rep in reps:
        if bounded:
            rep["arithmetic_bound"] = arithmetic_bound(rep["one"], args.live, translator.decode.beam, row_flops, peak)
    occupied = occupancy(translator, sources, args.live)
    profile_lines = ([line for live in (1, args.live) for line in profiled(translator, sources[: 5 * live], live)]
                     if args.profile else [])
    results = {"command": command_line(), "cpu_kind": cpu_kind(), "machine": machine(torch.device("cpu"), args.threads),
               "model": str(args.run_dir), "precision": args.precision, "live": args.live, "reps": reps,
               f"{products}_matmul_peak_tflops": peak / 1e12,
               "summary": {"step_ms_1": spread([r["one"]["step_ms"] for r in reps]),
                           f"step_ms_{args.live}": spread([r["live"]["step_ms"] for r in reps]),
                           "join_ms": spread([r["live"]["join_ms"] for r in reps]),
                           "ceiling": spread([r["ceiling"] for r in reps]),
                           **({"arithmetic_bound": spread([r["arithmetic_bound"] for r in reps])} if bounded else {})},
               "row_flops": row_flops, "occupancy": occupied}
    if profile_lines:
        results["profile"] = profile_lines
    if args.beside:
        results["beside"] = args.beside
        results["summary"].update(
            step_ms_1_beside=spread([r["one_beside"]["step_ms"] for r in reps]),
            **{f"step_ms_{args.live}_beside": spread([r["live_beside"]["step_ms"] for r in reps])},
            join_ms_beside=spread([r["live_beside"]["join_ms"] for r in reps]),
            ceiling_beside=spread([r["ceiling_beside"] for r in reps]),
            ceiling_all=spread([(args.beside + 1) * r["ceiling_beside"] for r in reps]))
    print(f"{products} matmul peak {peak / 1e12:.2f} TFLOP/s; " + (
          f"at that peak the products of the rows that {args.live} sentences add to one ({row_flops / 1e6:.1f} MFLOP "
          f"a row) bound the ceiling at {results['summary']['arithmetic_bound']['median']:.2f}×" if bounded else
          "int8 products run past it: no arithmetic bound"),
          f"with {args.live} sentences a step reads self-attention buffers {occupied['self_width']:.1f} columns wide, "
          f"where a row has written {occupied['columns_written']:.1f} on average, and memories "
          f"{occupied['memory_width']:.1f} positions wide for sources of {occupied['source_length']:.1f}; "
          f"{occupied['rows_kept_in_place']:.0%} of the beams' rows could stay in place at a reorder",
          *profile_lines, sep="\n")
    write_results(args.out or RESULTS / f"decode-steps-{cpu_kind()}-{args.precision}.json", results)


if __name__ == "__main__":
    main()
