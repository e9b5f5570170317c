"""Would a decoding step compiled by torch.compile (Inductor) pay on a CPU? The eager steps aiayn
runs against the same step compiled, in bf16, at beam 4: a measurement of a path aiayn does not
take (docs/speed-notes.md, "Tried: a compiled decoding step on a CPU").

For M sentences of a run's model (source width 32, room for 80 positions), each repetition times
the steps at positions 0 to 59 (the median of 10 to 59) of, in turn (after one repetition that
warms up and is not kept):

    eager     aiayn.translate.ModelStep over aiayn.cache.KVCache with the bf16 decoding copy
              (aiayn.inference: packed weights), what `aiayn translate` and `aiayn serve` run
    static    the fixed-shape step of aiayn.graphs (GraphedStep without a graph): every row
              attends over all 80 positions, the later ones masked; the plain bf16 model
    compiled  that static step through torch.compile (dynamic shapes; Inductor's freezing lays
              the weights out for oneDNN); `compile_s` is its first compilation, for the first M

    python benchmarks/compiled_step.py runs/demo --sentences 1 8 --threads 1   # a server's worker
    python benchmarks/compiled_step.py runs/demo --sentences 1 16 --threads 2 --profile 16

Writes results/compiled-step-KIND.json, or --out (with --profile, the profile's table too).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from aiayn.graphs import GraphedStep
from aiayn.run import load_for_inference
from aiayn.translate import ModelStep, decoding_model
from common import (RESULTS, command_line, cpu_kind, machine, or_exit, parse_args, positive_int, require_precision,
                    spread, write_results)

BEAM, SOURCE_WIDTH, POSITIONS, STEPS, UNTIMED = 4, 32, 80, 60, 10


def step_ms(step, sentences: int) -> float:
    """The median time of steps UNTIMED..STEPS of `step` (tokens (M·beam,) -> log-probabilities)."""
    tokens = torch.full((sentences * BEAM,), 5)  # any token: the time does not depend on it
    times = []
    for _ in range(STEPS):
        began = time.perf_counter()
        step(tokens)
        times.append(time.perf_counter() - began)
    return statistics.median(times[UNTIMED:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sentences", type=positive_int, nargs="+", default=[1, 8], help="M, each in turn (default 1 8)")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--profile", type=positive_int, metavar="M", help="then profile the compiled steps of M sentences (one of "
                        "--sentences): the operators and Inductor's kernels that take the most time")
    parser.add_argument("--out", type=Path)
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    if not args.run_dir.exists():
        parser.exit(2, f"error: {args.run_dir} does not exist\n")
    if args.profile and args.profile not in args.sentences:
        parser.exit(2, f"error: --profile {args.profile} is not one of --sentences\n")
    require_precision("bf16")
    torch.set_num_threads(args.threads)
    from torch._inductor import config as inductor_config

    inductor_config.freezing = True  # weights are constants of the graph, laid out once
    inductor_config.cpp.enable_kernel_profile = bool(args.profile)  # each generated kernel a row of the profile
    model, _ = or_exit(lambda: load_for_inference(args.run_dir, torch.device("cpu")))  # a folder of no model: one line
    model.eval()
    plain = copy.deepcopy(model).to(torch.bfloat16)
    packed = decoding_model(model, "bf16")
    compiled = torch.compile(plain.next_log_probs, dynamic=True)
    generator = torch.Generator().manual_seed(0)
    sources = {m: torch.randint(4, model.config.vocab_size, (m, SOURCE_WIDTH), generator=generator) for m in args.sentences}
    compile_s = None
    reps = []
    with torch.inference_mode():
        for rep in range(args.reps + 1):  # the first warms up (oneDNN's kernels, the compilation): not kept
            row = {}
            for m, src in sources.items():
                eager = ModelStep(packed, src, POSITIONS, BEAM)
                eager.reorder(torch.arange(m).repeat_interleave(BEAM), torch.arange(m), BEAM)  # a row per beam
                static = GraphedStep(plain, src, POSITIONS, BEAM, graph=False).run.cache
                ms = {"eager": step_ms(eager.step, m), "static": step_ms(lambda t: plain.next_log_probs(t, static), m)}
                state = GraphedStep(plain, src, POSITIONS, BEAM, graph=False).run.cache
                if compile_s is None:
                    began = time.perf_counter()
                    compiled(torch.full((m * BEAM,), 5), state)
                    compile_s = time.perf_counter() - began
                    state = GraphedStep(plain, src, POSITIONS, BEAM, graph=False).run.cache
                ms["compiled"] = step_ms(lambda t: compiled(t, state), m)
                row[str(m)] = ms
                print(f"{f'rep {rep}' if rep else 'warm-up'}, {m} sentences: eager {ms['eager']:.2f} ms, static {ms['static']:.2f} ms, "
                      f"compiled {ms['compiled']:.2f} ms", flush=True)
            reps += [row] if rep else []
        table = None
        if args.profile:
            state = GraphedStep(plain, sources[args.profile], POSITIONS, BEAM, graph=False).run.cache
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step_ms(lambda t: compiled(t, state), args.profile)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60)
            print(table)
    record = machine(torch.device("cpu"), args.threads)  # with the bf16 matmul peak on these threads
    summary = {m: {way: spread([r[str(m)][way] for r in reps]) for way in ("eager", "static", "compiled")} for m in args.sentences}
    print(f"compiled in {compile_s:.1f} s; bf16 matmul peak {record['matmul_peak_tflops']['bf16']:.2f} TFLOP/s")
    write_results(args.out or RESULTS / f"compiled-step-{cpu_kind()}.json", {
        "command": command_line(), "cpu_kind": cpu_kind(), "machine": record,
        "model": str(args.run_dir), "beam": BEAM, "source_width": SOURCE_WIDTH, "positions": POSITIONS,
        "compile_s": compile_s, "reps": reps, "summary_ms": summary,
        **({"profile": {"sentences": args.profile, "table": table}} if table else {})})


if __name__ == "__main__":
    main()
