"""`aiayn serve` under load: N concurrent clients against the same requests sent one at a time.

Starts two `aiayn serve` processes on loopback with the same model: one with the default
batching (requests wait up to --max-wait-ms for company), and one with --max-wait-ms 0 for the
one-at-a-time client, so that the baseline pays no batching wait. Each client keeps one HTTP
connection and sends one test verse of bible-en-es per request (beam 4, α 0.6: §6.1), the
verses taken in one fixed shuffled order, for --seconds. The two modes alternate, --reps times;
each repetition starts both modes at the same verse. Reports sentences/s, latency p50/p95/p99
and the error count per mode (medians and range over repetitions), the throughput ratio, and the
servers' resident memory (with their worker processes), and the machine's matmul peak. Writes
results/serve-load-CPUKIND-PRECISION.json.

    python benchmarks/serve_load.py runs/demo                         # 16 clients, 3 × 30 s each
    python benchmarks/serve_load.py runs/demo --compare-with ../old   # and one client and 16 against
                                                                      # the aiayn of another checkout
    python benchmarks/serve_load.py runs/demo --workers 2 --compare-workers 1
                                                 # both servers with 2 worker processes, and 16
                                                 # clients against one with 1 (the default)
    python benchmarks/serve_load.py runs/demo --memory-minutes 10     # 16 clients for 10 minutes:
                                                                      # resident memory every 5 s
The memory run writes results/serve-memory-CPUKIND-PRECISION.json and
docs/serve-memory-CPUKIND-PRECISION.png (with --out FILE.json: FILE.png beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from aiayn.run import resolve_model_dir
from aiayn.serve.process import ServerProcess
from aiayn.files import atomic_write
from common import (HERE, RESULTS, check_output, command_line, cpu_kind, default_threads, machine, or_exit, parse_args,
                    positive_float, positive_int, require_precision, revision, spread, tree_rss_mib, write_results)

WARM_UP_SECONDS = 5.0  # each concurrent server's, before the first timed repetition


def get(port: int, path: str) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def load(port: int, clients: int, seconds: float, verses: list[str], start: int, libre: Optional[tuple] = None) -> dict:
    """`clients` threads, each sending one verse per request on its own keep-alive connection
    until `seconds` have passed; verses are handed out in order from `start`. Requests are aiayn's
    own (`{"text": ...}`), or with `libre` = (source, target) LibreTranslate's
    (`{"q": ..., "source": ..., "target": ...}`, answered `{"translatedText": "..."}`)."""
    lock = threading.Lock()
    cursor = [start]
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while time.monotonic() < deadline:
            with lock:
                verse = verses[cursor[0] % len(verses)]
                cursor[0] += 1
            body = json.dumps({"q": verse, "source": libre[0], "target": libre[1]} if libre else {"text": verse}).encode()
            began = time.perf_counter()
            try:
                connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                ok = response.status == 200 and (isinstance(json.loads(answer)["translatedText"], str) if libre
                                                 else len(json.loads(answer)["translations"]) == 1)
            except (OSError, http.client.HTTPException, ValueError) as error:
                ok, answer = False, repr(error).encode()
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            elapsed = time.perf_counter() - began
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors.append(answer.decode(errors="replace")[:200])
        connection.close()

    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"clients": clients, "seconds": round(wall, 2), "sentences": len(latencies), "errors": len(errors),
            "error_samples": errors[:3], "sentences_per_s": len(latencies) / wall,
            "latency_ms": {"p50": cuts[49] * 1000, "p95": cuts[94] * 1000, "p99": cuts[98] * 1000}}


def test_verses() -> list[str]:
    """The source side of bible-en-es's test books, in one fixed shuffled order."""
    from aiayn.corpora import load_corpus

    verses = [source for source, _ in load_corpus("bible-en-es").splits["test"]]
    random.Random(0).shuffle(verses)
    return verses


class MemorySampler(threading.Thread):
    """The server's resident memory every `every` seconds, as (seconds since start, MiB)."""

    def __init__(self, server: ServerProcess, every: float) -> None:
        super().__init__(daemon=True)
        self.server, self.every, self.samples, self.done = server, every, [], threading.Event()

    def run(self) -> None:
        began = time.monotonic()
        while not self.done.is_set():
            self.samples.append((round(time.monotonic() - began, 1), round(tree_rss_mib(self.server.pid), 1)))
            self.done.wait(self.every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/demo", help="the model to serve (default runs/demo)")
    parser.add_argument("--clients", type=positive_int, default=16)
    parser.add_argument("--seconds", type=positive_float, default=30.0, help="per mode and repetition (default 30)")
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    parser.add_argument("--memory-minutes", type=positive_float, help="instead: one run of --clients for this long, memory sampled")
    parser.add_argument("--compare-with", type=Path, metavar="CHECKOUT",
                        help="also serve the model with the aiayn of this source tree (e.g. a git worktree of an older "
                             "revision) to the same one client and the same clients, interleaved")
    parser.add_argument("--workers", type=positive_int, default=1, help="aiayn serve --workers of both servers (default 1)")
    parser.add_argument("--compare-workers", type=positive_int, metavar="K",
                        help="also serve the model with --workers K (with --compare-with, from that checkout) to the "
                             "same one client and the same clients, interleaved")
    parser.add_argument("--out", type=Path)
    args = parse_args(parser, inputs=lambda args: [args.run_dir])
    if not Path(args.run_dir).exists():
        parser.exit(2, f"error: {args.run_dir} does not exist (make demo trains runs/demo)\n")
    if args.compare_with and not (args.compare_with / "aiayn" / "serve").is_dir():  # (found in a misuse hunt: a traceback
        parser.exit(2, f"error: --compare-with {args.compare_with}: no aiayn checkout there\n")  # once two servers ran)
    if args.memory_minutes and args.out:  # its figure beside it: checked too, and never the results file itself
        if args.out.suffix == ".png":
            parser.exit(2, f"error: --out {args.out}: the results are JSON; the figure goes beside them as .png\n")
        check_output(memory_figure(args, cpu_kind()), args.force, [Path(args.run_dir)])
    or_exit(lambda: resolve_model_dir(args.run_dir))  # a folder of no model: one line, not a server that fails to start
    require_precision(args.precision)
    verses = test_verses()
    kind = cpu_kind()
    options = ("--precision", args.precision, "--workers", str(args.workers))
    results = {"command": command_line(), "cpu_kind": kind, "machine": machine_info(), "model": args.run_dir,
               "precision": args.precision, "workers": args.workers,
               "requests": "one test verse of bible-en-es each, beam 4, α 0.6",
               f"{peak_precision(args.precision)}_matmul_peak_tflops": matmul_peak(args.precision)}
    with ServerProcess(args.run_dir, *options) as batching:
        results["model_info"] = {k: get(batching.port, "/info")[k] for k in ("parameters", "batching")}
        # Warm-up at the load it will be timed at: a server compiles kernels for each new batch shape
        # (found in review: 2 clients for 3 s left the shapes of 16 to the first timed repetition).
        load(batching.port, args.clients, WARM_UP_SECONDS, verses, 0)
        if args.memory_minutes:
            sampler = MemorySampler(batching, 5.0)
            sampler.start()
            run = load(batching.port, args.clients, args.memory_minutes * 60, verses, 0)
            sampler.done.set()
            sampler.join()
            results.update(run=run, rss_mib=sampler.samples, health=get(batching.port, "/health"))
            write_results(args.out or RESULTS / f"serve-memory-{kind}-{args.precision}.json", results)
            plot_memory(sampler.samples, args, kind, run)
            return
        with contextlib.ExitStack() as stack:
            alone = stack.enter_context(ServerProcess(args.run_dir, *options, "--max-wait-ms", "0"))
            compared = args.compare_with or args.compare_workers
            workers = args.compare_workers or args.workers  # named only where not 1: older checkouts lack the flag
            baseline_options = ("--precision", args.precision, *(("--workers", str(workers)) if workers > 1 else ()))
            baseline = compared and stack.enter_context(ServerProcess(args.run_dir, *baseline_options,
                                                                      checkout=args.compare_with))
            baseline_alone = compared and stack.enter_context(ServerProcess(
                args.run_dir, *baseline_options, "--max-wait-ms", "0", checkout=args.compare_with))
            load(alone.port, 1, 3, verses, 0)
            if baseline:
                load(baseline.port, args.clients, WARM_UP_SECONDS, verses, 0)
                load(baseline_alone.port, 1, 3, verses, 0)
                results["baseline"] = {"checkout": str(args.compare_with or HERE.parent),
                                       "revision": revision(args.compare_with),
                                       "workers": workers}
            reps = []
            for rep in range(args.reps):
                start = rep * 97  # each repetition its own verses; every mode the same ones
                one = answered(load(alone.port, 1, args.seconds, verses, start), args.seconds)
                many = load(batching.port, args.clients, args.seconds, verses, start)
                reps.append({"one_at_a_time": one, "concurrent": many,
                             "ratio": many["sentences_per_s"] / one["sentences_per_s"]})
                line = (f"rep {rep + 1}: one at a time {one['sentences_per_s']:.1f} sentences/s, "
                        f"{args.clients} clients {many['sentences_per_s']:.1f} sentences/s ({reps[-1]['ratio']:.2f}×)")
                if baseline:
                    old_one = answered(load(baseline_alone.port, 1, args.seconds, verses, start), args.seconds)
                    old = load(baseline.port, args.clients, args.seconds, verses, start)
                    reps[-1].update(baseline_one_at_a_time=old_one, baseline_concurrent=old,
                                    one_vs_baseline=one["sentences_per_s"] / old_one["sentences_per_s"],
                                    vs_baseline=many["sentences_per_s"] / old["sentences_per_s"])
                    line += (f", baseline: one at a time {old_one['sentences_per_s']:.1f}, {args.clients} clients "
                             f"{old['sentences_per_s']:.1f} sentences/s")
                print(f"{line}, errors {one['errors']} / {many['errors']}", flush=True)
            results["reps"] = reps
            results["summary"] = summarize(reps)
            results["rss_mib"] = {"batching_server": tree_rss_mib(batching.pid),
                                  "one_at_a_time_server": tree_rss_mib(alone.pid)}
            if baseline:
                results["rss_mib"]["baseline_server"] = tree_rss_mib(baseline.pid)
                results["rss_mib"]["baseline_one_at_a_time_server"] = tree_rss_mib(baseline_alone.pid)
            results["health"] = get(batching.port, "/health")
    write_results(args.out or RESULTS / f"serve-load-{kind}-{args.precision}.json", results)


def answered(run: dict, seconds: float) -> dict:
    """`run`, the one-at-a-time client's, which every ratio divides by: none answered is one line
    (found in a misuse hunt: --seconds 0.0001 was a ZeroDivisionError)."""
    if not run["sentences"]:
        sys.exit(f"serve_load: no sentence answered one at a time in {seconds:g} s ({run['errors']} errors"
                 f"{': ' + run['error_samples'][0] if run['error_samples'] else ''}); give more --seconds")
    return run


def machine_info() -> dict:
    import torch

    return machine(torch.device("cpu"), default_threads())


def peak_precision(precision: str) -> str:
    """The matmul peak a decoding precision is recorded against: an int8 copy's products are
    FBGEMM's int8 GEMMs (activations quantized per call), which this measures no peak of, so
    int8 runs record the fp32 peak, named so (it is no roof of int8 products)."""
    return "fp32" if precision == "int8" else precision


def matmul_peak(precision: str) -> float:
    """This machine's matmul peak in TFLOP/s, measured before any server starts."""
    import torch

    from aiayn.device import matmul_peak_flops

    return matmul_peak_flops(torch.device("cpu"), peak_precision(precision)) / 1e12


def summarize(reps: list[dict]) -> dict:
    summary = {"ratio": spread([r["ratio"] for r in reps])}
    modes = ["one_at_a_time", "concurrent"]
    if "vs_baseline" in reps[0]:
        summary["vs_baseline"] = spread([r["vs_baseline"] for r in reps])
        summary["one_vs_baseline"] = spread([r["one_vs_baseline"] for r in reps])
        modes += ["baseline_one_at_a_time", "baseline_concurrent"]
    for mode in modes:
        runs = [r[mode] for r in reps]
        summary[mode] = {
            "sentences_per_s": spread([r["sentences_per_s"] for r in runs]),
            **{f"latency_{p}_ms": spread([r["latency_ms"][p] for r in runs]) for p in ("p50", "p95", "p99")},
            "errors": sum(r["errors"] for r in runs),
        }
    print(json.dumps(summary, indent=1))
    return summary


def plot_memory(samples: list, args: argparse.Namespace, kind: str, run: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([t / 60 for t, _ in samples], [m for _, m in samples])
    ax.set_xlabel("minutes under load")
    ax.set_ylabel("server resident memory (MiB)")
    ax.set_ylim(0, max(m for _, m in samples) * 1.15)
    ax.set_title(f"aiayn serve, {args.clients} clients, {run['sentences']:,} sentences, "
                 f"{run['errors']} errors ({kind})", fontsize=10)
    fig.tight_layout()
    path = memory_figure(args, kind)
    or_exit(lambda: atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100)))
    print(f"wrote {path}")


def memory_figure(args: argparse.Namespace, kind: str) -> Path:
    """The docs' figure, unless --out sends the results elsewhere (a trial run): then beside them."""
    return args.out.with_suffix(".png") if args.out else HERE.parent / "docs" / f"serve-memory-{kind}-{args.precision}.png"


if __name__ == "__main__":
    main()
