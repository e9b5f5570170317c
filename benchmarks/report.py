"""Render the benchmark results as markdown (docs/benchmarks.md) and the sweep plots as PNGs.

    python benchmarks/report.py                      # results/speed-cpu.json + results/sweep-cpu.json
    python benchmarks/report.py --speed results/speed-cuda.json --sweep results/sweep-cuda.json --out docs/benchmarks-cuda.md
    python benchmarks/report.py --speed results/speed-decode-amd-epyc.json --no-sweep --out docs/benchmarks-decode-amd-epyc.md

The plots go into a folder named after the output file without its suffix (docs/benchmarks/ for
docs/benchmarks.md), linked from the markdown by relative paths.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from aiayn.files import atomic_text, read_json  # noqa: E402
from common import RESULTS, command_line, or_exit, parse_args, peak_share  # noqa: E402
from systems import PEER_NAMES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NAMES = {"aiayn": "aiayn", "torch": "torch.nn.Transformer", "marian": "HF MarianMTModel",
         "ctranslate2": "CTranslate2", "matmul": "matmul", **PEER_NAMES}
PRECISIONS = {"fp32": "fp32", "tf32": "fp32 (TF32)", "bf16": "bf16", "fp16": "fp16", "int8": "int8"}


def model_cell(case: dict) -> list[str]:
    """The Model column's cell, where a result holds more than Table 3's base."""
    return [case.get("model", "base")]


def number(x: Optional[float]) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def spread(stats: Optional[dict], scale: float = 1.0) -> tuple[str, str]:
    """(median, 'min–max') of a summary, times `scale`."""
    if not stats:
        return "–", "–"
    return number(stats["median"] * scale), f"{number(stats['min'] * scale)}–{number(stats['max'] * scale)}"


def ratio(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def speed_ratio(case: dict) -> str:
    """The ratio to aiayn, naming aiayn's precision where it differs (int8 is set against fp32)."""
    text = ratio(case.get("ratio"))
    reference = case.get("reference_precision")
    return text if reference in (None, case["precision"]) else f"{text} (vs {reference})"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def variants(case: dict) -> list[str]:
    """How a case runs its system beside the plain way: compiled, bf16 weights, CUDA graphs."""
    return [name for flag, name in (("compile", "torch.compile"), ("bf16_weights", "bf16 weights"),
                                    ("cuda_graphs", "CUDA graphs")) if case.get(flag)]


def system_name(case: dict) -> str:
    return NAMES[case["system"]] + "".join(f" ({variant})" for variant in variants(case))


def machine_section(info: dict, settings_line: str) -> list[str]:
    v = info["versions"]
    flags = ", ".join(info["cpu_flags"]) or "none of avx2/avx512/amx"
    lines = [
        f"- CPU: {info['cpu']}{' (' + info['cpu_kind'] + ')' if info.get('cpu_kind') else ''} ({flags}); "
        f"{info['logical_cpus']} logical CPUs, {info['cpus_available']} available, "
        f"**{info['threads_used']} threads** used",
    ]
    if info.get("gpu"):
        lines.append(f"- GPU: {info['gpu']}")
    lines += [
        f"- torch {v['torch']}, transformers {v['transformers']}, ctranslate2 {v['ctranslate2']}, "
        f"aiayn {v['aiayn'] or 'from its checkout'}{' at ' + info['revision'][:12] if info.get('revision') else ''}, "
        f"Python {info['python']}, {info['os']}",
        f"- {settings_line}; measured {info['date']}",
    ]
    return lines


def speed_section(results: dict) -> list[str]:
    cases, s = results["cases"], results["settings"]
    lines = ["## Training and decoding speed", ""]
    reps = f"{s['reps']} repetition{'s' if s['reps'] != 1 else ''}"
    lines += machine_section(results["machine"], f"{reps} of every case, each in a fresh process, interleaved")
    lines += ["", "\"vs aiayn\": this system's median over aiayn's for the same task, model and precision, or aiayn's "
              "bf16, then fp32, where aiayn lacks the precision (tokens/s: > 1 is "
              "faster; memory: > 1 is more). Memory: peak of the measuring process (see the notes below).", ""]

    peaks = {c["precision"]: c for c in cases if c["task"] == "peak"}
    if any(c["task"] == "train" for c in cases):
        lines += training_table(cases, s)
    if any(c["task"] == "decode" for c in cases):
        lines += decoding_table(cases, s)
    lines += ["", "### Matmul peak", "", "aiayn.device.matmul_peak_flops: square matrix products, measured among the other cases.", ""]
    lines += table(["Precision", "TFLOP/s", "min–max"], [[p, *spread(c.get("tflops"))] for p, c in peaks.items()])
    unmeasured = [c["label"] for c in cases if not c["reps"] and not c["errors"]]
    if unmeasured:
        lines += ["", f"Not measured ({results.get('stopped', 'no run')}): {', '.join(unmeasured)}."]
    failed = [c["label"] for c in cases if c["errors"]]
    if failed:
        lines += ["", f"Failed repetitions (see the result file): {', '.join(failed)}."]
    lines += ["", "### Fairness notes", "", *(f"- {note}" for note in results["fairness_notes"])]
    return lines


def training_table(cases: list[dict], s: dict) -> list[str]:
    training = [c for c in cases if c["task"] == "train"]
    lines = ["### Training: target tokens/s", "", f"Adam steps, label smoothing {s['label_smoothing']}."]
    if any(not c.get("budget") for c in training):
        lines.append(f"Fixed batch: {s['rows']} pairs of {s['src_len']} + {s['tgt_len']} tokens, {s['train_warmup']} "
                     f"warm-up + {s['train_steps']} timed steps per process.")
    for budget, warmup, count in s.get("budgets", []):
        lines.append(f"{budget:,}-token batches: {count} real batch shapes (token budgets cut by aiayn's batching from "
                     f"the sentence lengths of {s['corpus']}, the same for every system), each timed once after "
                     f"{warmup} warm-up step{'s' if warmup != 1 else ''}; tokens/s count real (non-pad) target tokens.")
    lines += ["TFLOP/s count the same model FLOPs for every system (padding not counted); the share is of the "
              "matmul peak of the same precision measured in this run, the highest of its repetitions.", ""]
    rows = []
    models = any(c.get("model", "base") != "base" for c in cases)
    for c in training:
        median, rng = spread(c.get("tokens_per_s"))
        roof = next((p for p in cases if p["task"] == "peak" and p["precision"] == c["precision"] and "tflops" in p), None)
        share = f"{peak_share(c['tflops'], roof['tflops']):.0%}" if roof and "tflops" in c else "–"  # (files of before: of the median)
        params = f"{c['parameters'] / 1e6:.2f}" if "parameters" in c else "–"
        batches = f"{c['budget']:,} tokens" if c.get("budget") else "fixed"
        rows.append([*(model_cell(c) if models else []), batches, system_name(c), params, PRECISIONS[c["precision"]],
                     median, rng, speed_ratio(c), spread(c.get("tflops"))[0], share, spread(c.get("peak_mib"))[0],
                     ratio(c.get("memory_ratio"))])
    lines += table([*(["Model"] if models else []), "Batches", "System", "Parameters (M)", "Precision", "tokens/s",
                    "min–max", "vs aiayn", "TFLOP/s", "of peak", "peak MiB", "memory vs aiayn"], rows)
    compiled = [c for c in training if "compile_s" in c]
    if compiled:
        lines += ["", "torch.compile (`TrainConfig.compile`): graphs compiled per process and the seconds of the steps "
                  "that compiled them (warm-up steps, not timed; since 2026-11-25 every process compiles afresh, "
                  "without Inductor's on-disk graph caches; before, only the first process did):", ""]
        lines += [f"- {'big ' if c.get('model') == 'big' else ''}{PRECISIONS[c['precision']]}: {c['compiles']['max']} graph(s), {number(c['compile_s']['median'])} s "
                  f"({number(c['compile_s']['min'])}–{number(c['compile_s']['max'])})" for c in compiled]
    return lines + [""]


def decoding_table(cases: list[dict], s: dict) -> list[str]:
    lines = ["### Decoding: output tokens/s", "",
              f"{s['sentences']} sentence{'s' if s['sentences'] != 1 else ''} of {s['src_len']} source tokens, every "
              f"output forced to exactly "
              f"{s['out_len']} tokens (checked); {s['decode_warmup']} warm-up + {s['decode_calls']} timed call(s) "
              "over all sentences per process.", ""]
    rows = []
    models = any(c.get("model", "base") != "base" for c in cases)
    for c in (c for c in cases if c["task"] == "decode"):
        median, rng = spread(c.get("tokens_per_s"))
        rows.append([*(model_cell(c) if models else []), str(c["beam"]), system_name(c), PRECISIONS[c["precision"]],
                     median, rng, speed_ratio(c), spread(c.get("peak_mib"))[0], ratio(c.get("memory_ratio"))])
    lines += table([*(["Model"] if models else []), "Beam", "System", "Precision", "tokens/s", "min–max", "vs aiayn",
                    "peak MiB", "memory vs aiayn"], rows)
    lines += [""]
    for beam in sorted({c["beam"] for c in cases if c["task"] == "decode"}, reverse=True):
        peers = [c for c in cases if c["task"] == "decode" and c["beam"] == beam and c["system"] == "ctranslate2"
                 and "tokens_per_s" in c]
        ours = [c for c in cases if c["task"] == "decode" and c["beam"] == beam and c["system"] == "aiayn"
                and not c.get("compile") and "tokens_per_s" in c]
        if peers and ours:
            best, peer = (max(cs, key=lambda c: c["tokens_per_s"]["median"]) for cs in (ours, peers))
            how = ", ".join([*variants(best), PRECISIONS[best["precision"]]])
            times = best["tokens_per_s"]["median"] / peer["tokens_per_s"]["median"]
            lines.append(f"- {'greedy' if beam == 1 else f'beam {beam}'}: aiayn's fastest ({how}) at {times:.2f}× "
                         f"CTranslate2's fastest ({PRECISIONS[peer['precision']]}) tokens/s")
    return lines


def attention_name(r: Optional[int]) -> str:
    return f"local (r = {r})" if r else "full"


def sweep_plots(results: dict, folder: Path) -> dict[str, Path]:
    """Log-log time and memory against n, full vs local attention. Returns {what: png}."""
    folder.mkdir(parents=True, exist_ok=True)
    fits = {(f["precision"], f["neighborhood"]): f for f in results["fits"]}
    paths = {}
    for what, key, label in (("time", "median_s", "forward + backward time (s)"), ("memory", "working_mib", "working memory (MiB)")):
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for (precision, r), fit in fits.items():
            points = [p for p in results["points"] if p["precision"] == precision and p["neighborhood"] == r and key in p]
            exponent = fit[what]["exponent"]
            name = f"{attention_name(r)}, {precision}" + (f": ∝ $n^{{{exponent:.2f}}}$" if exponent is not None else "")
            x, y = [p["n"] for p in points], [p[key] for p in points]
            if key == "median_s":  # the range of the timed passes as error bars
                below = [p[key] - p["seconds"]["min"] for p in points]
                above = [p["seconds"]["max"] - p[key] for p in points]
                ax.errorbar(x, y, yerr=[below, above], marker="o", capsize=3, label=name)
            else:
                ax.plot(x, y, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(results["settings"]["lengths"], [str(n) for n in results["settings"]["lengths"]])
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.set_title(f"One encoder layer, batch 1: {what} vs n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths[what] = folder / f"sweep-{what}.png"
        fig.savefig(paths[what], dpi=120)
        plt.close(fig)
    return paths


def time_cell(point: Optional[dict]) -> str:
    """'median (min–max)' in ms of a sweep point, or a dash where it failed or is missing."""
    if not point or "seconds" not in point:
        return "–"
    median, rng = spread(point["seconds"], 1e3)
    return f"{median} ({rng})"


def sweep_section(results: dict, out: Path) -> list[str]:
    s = results["settings"]
    lines = ["## Self-attention cost against sequence length (Table 1)", ""]
    lines += machine_section(results["machine"], f"{s['reps']} timed passes after {s['warmup']} warm-up per point, each point in a fresh process")
    lines += ["", f"One aiayn encoder layer (d_model {s['d_model']}, {s['n_heads']} heads, d_ff {s['d_ff']}, dropout "
              f"{s['dropout']}, training mode), batch {s['batch']}, forward + backward. Time: median (min–max) in ms. "
              "Working memory: peak resident set during the passes minus the resident set before them (on a GPU: "
              "torch's allocated memory), in MiB.", ""]
    curves = list(dict.fromkeys((p["precision"], p["neighborhood"] or 0) for p in results["points"]))  # run order
    header = ["n"] + [f"{attention_name(r)} {p} ms" for p, r in curves] + [f"{attention_name(r)} {p} MiB" for p, r in curves]
    rows = []
    for n in s["lengths"]:
        at = {(p["precision"], p["neighborhood"] or 0): p for p in results["points"] if p["n"] == n}
        times = [time_cell(at.get(c)) for c in curves]
        memory = [number(at[c].get("working_mib")) if c in at else "–" for c in curves]
        rows.append([str(n), *times, *memory])
    lines += table(header, rows)
    lines += [""]
    for fit in results["fits"]:
        t, m = fit["time"], fit["memory"]
        if t["exponent"] is None:
            continue
        used = f"n = {min(t['points'])}…{max(t['points'])}, {len(t['points'])} points"
        memory = f", working memory ∝ n^{m['exponent']:.2f}" if m["exponent"] is not None else ""
        lines.append(f"- {attention_name(fit['neighborhood'])}, {fit['precision']}: time ∝ n^{t['exponent']:.2f}{memory} "
                     f"(least squares on log-log, {used})")
    plots = sweep_plots(results, out.with_suffix(""))
    for what, path in plots.items():
        lines += ["", f"![{what} against n]({os.path.relpath(path, out.parent)})"]
    return lines


def recorded_command(results: dict) -> list[str]:
    """The command a result records, as it was run, and where the script's defaults have moved
    since, the flags that repeat it today (found in a docs audit: `python benchmarks/speed.py` of a
    result from before real batch shapes now also trains on them, hours on a CPU)."""
    lines = [results["command"]]
    if results.get("benchmark") == "speed" and "budgets" not in results.get("settings", {}) \
            and "--batches" not in results["command"]:
        lines.append(f"# measured before --batches; today the same cases: {results['command']} --batches fixed")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", type=Path, default=RESULTS / "speed-cpu.json")
    parser.add_argument("--sweep", type=Path, default=RESULTS / "sweep-cpu.json")
    parser.add_argument("--no-sweep", action="store_true", help="the speed section only")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parse_args(parser)

    sources = (("speed", args.speed),) + ((("sweep", args.sweep),) if not args.no_sweep else ())
    if missing := [f"--{name} {path}" for name, path in sources if path != parser.get_default(name) and not path.exists()]:
        parser.error(f"no such file: {', '.join(missing)}")  # a default may be missing; a path given may not (found in review)
    loaded = {name: or_exit(lambda: read_json(path)) for name, path in sources if path.exists()}
    if wrong := [f"--{name} {path} is not a {name}.py result" for name, path in sources if name in loaded
                 and (not isinstance(loaded[name], dict) or loaded[name].get("benchmark") != name)]:
        parser.error("; ".join(wrong))  # (found in a misuse hunt: a KeyError)
    if not args.no_sweep and not args.out.suffix:  # its plots go into OUT without its suffix: the markdown's own path
        parser.error(f"--out {args.out}: give the markdown a suffix (.md); the plots go into {args.out}/")
    if not loaded:
        parser.error(f"neither {args.speed} nor {args.sweep} exists: run benchmarks/speed.py and benchmarks/sweep.py first")
    readme = os.path.relpath(ROOT / "benchmarks" / "README.md", args.out.resolve().parent)
    models = {c.get("model", "base") for results in loaded.values() for c in results.get("cases", [])}
    shapes = ["Transformer-base (6 + 6 layers, d_model 512, 8 heads, d_ff 2048)"] if "base" in models or not models else []
    shapes += ["Transformer-big (6 + 6 layers, d_model 1024, 16 heads, d_ff 4096)"] if "big" in models else []
    lines = ["# Benchmarks", "",
             f"aiayn against peer implementations of the same shape: {' and '.join(shapes)}, a shared vocabulary "
             f"of 8,000, random weights. Made by the commands in [benchmarks/]({readme}):", "", "```bash"]
    lines += [line for results in loaded.values() for line in recorded_command(results)]
    lines += [command_line(), "```", ""]
    if any(results["quick"] for results in loaded.values()):
        lines += ["> **Quick (smoke-test) results: tiny sizes, not measurements.**", ""]
    if "speed" in loaded:
        lines += speed_section(loaded["speed"]) + [""]
    if "sweep" in loaded:
        lines += sweep_section(loaded["sweep"], args.out) + [""]
    or_exit(lambda: atomic_text(args.out, "\n".join(lines)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
