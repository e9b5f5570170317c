"""Self-attention cost against sequence length (Table 1 of the paper), measured on aiayn.

One aiayn encoder layer (d_model 512, 8 heads, d_ff 2048, dropout 0.1, training mode), batch 1,
forward + backward at n = 64 ... 4096, with full self-attention (O(n²·d) per layer) and with
restricted self-attention of neighbourhood r (O(r·n·d)). Every point runs in a fresh process
(one_case.py layer), so its peak memory is its own; the time is the median of --reps timed
passes after a warm-up. The exponent k of time ≈ c·n^k is the least-squares slope of log time
against log n over the points with n ≥ --fit-from (the small ones are dominated by the
feed-forward network and fixed overheads, which grow linearly).

Writes results/sweep-DEVICE.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import systems
from common import (command_line, default_output, default_threads, device_or_exit, machine, non_negative_int,
                    parse_args, positive_int, require_precision, run_case, spread, write_results)


def fit_exponent(points: list[dict], key: str, fit_from: int) -> dict:
    """Slope of log `key` against log n over the points with n >= fit_from."""
    used = [p for p in points if p["n"] >= fit_from and p.get(key)]
    if len(used) < 2:
        return {"exponent": None, "points": [p["n"] for p in used]}
    slope, _ = np.polyfit(np.log([p["n"] for p in used]), np.log([p[key] for p in used]), 1)
    return {"exponent": float(slope), "points": [p["n"] for p in used]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--max-n", type=positive_int, default=4096, help="longest sequence; lengths are 64, 128, ... up to it")
    parser.add_argument("--neighborhood", type=positive_int, default=128, help="r of restricted self-attention")
    parser.add_argument("--no-local", action="store_true", help="full attention only")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32"])
    parser.add_argument("--reps", type=positive_int, default=5, help="timed passes per point")
    parser.add_argument("--warmup", type=non_negative_int, default=1)
    parser.add_argument("--fit-from", type=positive_int, default=512, help="smallest n in the exponent fit")
    parser.add_argument("--quick", action="store_true", help="n up to 256, 2 passes: checks that the sweep runs")
    parser.add_argument("--out", type=Path, help="result file (default results/sweep-DEVICE.json)")
    args = parse_args(parser)
    if args.quick:
        args.max_n, args.reps, args.fit_from = min(args.max_n, 256), min(args.reps, 2), 64

    device = device_or_exit(args.device)
    require_precision(*args.precisions, device=device)  # (found in a misuse hunt: every point failed, exit 0)
    if args.max_n < 64:  # (found in a misuse hunt: no length at all, an empty result and exit 0)
        parser.error(f"--max-n {args.max_n}: the sweep starts at 64")
    neighborhoods = [None] if args.no_local else [None, args.neighborhood]
    for r in neighborhoods:
        systems.layer_config(r)  # fails now, with a clear message, if aiayn lacks the option
    lengths = [2**k for k in range(6, args.max_n.bit_length())]  # 64, 128, ... <= max_n
    points = []
    for precision in args.precisions:
        for n in lengths:  # full and local side by side at each n, so drifts hit both alike
            for r in neighborhoods:
                case = ["--device", str(device), "--threads", str(args.threads), "layer", "--n", str(n),
                        "--precision", precision, "--warmup", str(args.warmup), "--reps", str(args.reps)]
                case += ["--neighborhood", str(r)] if r else []
                result = run_case(case, args.threads)
                point = {"n": n, "neighborhood": r, "precision": precision, **result}
                if "times" in result:
                    point["seconds"] = spread(result["times"])
                    point["median_s"] = point["seconds"]["median"]
                points.append(point)
                attention = f"local r={r}" if r else "full"
                shown = result.get("error") or f"{point['median_s'] * 1e3:.1f} ms, working memory {result['working_mib']:.0f} MiB"
                print(f"n={n} {attention} {precision}: {shown}", flush=True)

    fits = []
    for precision in args.precisions:
        for r in neighborhoods:
            curve = [p for p in points if p["precision"] == precision and p["neighborhood"] == r]
            fits.append({
                "precision": precision, "neighborhood": r,
                "time": fit_exponent(curve, "median_s", args.fit_from),
                "memory": fit_exponent(curve, "working_mib", args.fit_from),
            })
    for fit in fits:
        attention = f"local r={fit['neighborhood']}" if fit["neighborhood"] else "full"
        exponent = fit["time"]["exponent"]
        print(f"{attention} {fit['precision']}: time ~ n^{exponent:.2f}" if exponent is not None else f"{attention}: no fit")

    results = {
        "benchmark": "sweep",
        "command": command_line(),
        "quick": args.quick,
        "machine": machine(device, args.threads),
        "settings": {"layer": "aiayn.model.EncoderLayer", "d_model": systems.CONFIG.d_model, "n_heads": systems.CONFIG.n_heads,
                     "d_ff": systems.CONFIG.d_ff, "dropout": systems.CONFIG.dropout, "batch": 1, "lengths": lengths,
                     "reps": args.reps, "warmup": args.warmup, "fit_from": args.fit_from},
        "points": points,
        "fits": fits,
    }
    write_results(args.out or default_output("sweep", device, args.quick), results)


if __name__ == "__main__":
    main()
