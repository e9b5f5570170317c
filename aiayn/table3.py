"""Table 3 of Vaswani et al. (2017), the paper's and ours in miniature (aiayn.experiment runs
the rows): its values, the table in its layout, the paper's conclusions judged against ours,
and the figure of each row against the base."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from aiayn.config import PAPER_PARAMS_M, ModelConfig
from aiayn.files import atomic_write, write_json

TABLE_MD, TABLE_JSON, TABLE_PNG = "table3.md", "table3.json", "table3.png"

# The base row again with another seed: how far two runs of one configuration land apart is the
# noise floor below which a row's difference from the base says nothing.
REPEAT = "base-seed2"
ROWS = ("base", REPEAT, "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
        "D1", "D2", "D3", "D4", "E")


@dataclass(frozen=True)
class PaperRow:
    """A row of the paper's Table 3: dev (newstest2013) perplexity per wordpiece and BLEU after
    100K steps. Its parameter count, where the table prints one, is `config.PAPER_PARAMS_M`."""

    ppl: float
    bleu: float


PAPER: dict[str, PaperRow] = {
    "base": PaperRow(4.92, 25.8),
    "A1": PaperRow(5.29, 24.9), "A2": PaperRow(5.00, 25.5), "A3": PaperRow(4.91, 25.8), "A4": PaperRow(5.01, 25.4),
    "B1": PaperRow(5.16, 25.1), "B2": PaperRow(5.01, 25.4),
    "C1": PaperRow(6.11, 23.7), "C2": PaperRow(5.19, 25.3), "C3": PaperRow(4.88, 25.5),
    "C4": PaperRow(5.75, 24.5), "C5": PaperRow(4.66, 26.0), "C6": PaperRow(5.12, 25.4), "C7": PaperRow(4.75, 26.2),
    "D1": PaperRow(5.77, 24.6), "D2": PaperRow(4.95, 25.5), "D3": PaperRow(4.67, 25.3), "D4": PaperRow(5.47, 25.7),
    "E": PaperRow(4.92, 25.7),
}


def paper_name(row: str) -> str:
    """The paper's row that `row` trains: the repeat of the base is the base."""
    return "base" if row == REPEAT else row


# -- the table ------------------------------------------------------------------------------------

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls")


def cells(result: dict) -> dict[str, object]:
    """The paper's configuration columns of one result."""
    config = ModelConfig.from_dict(result["config"])
    d_k, d_v = config.head_dims
    return {"N": config.n_layers, "d_model": config.d_model, "d_ff": config.d_ff, "h": config.n_heads, "d_k": d_k,
            "d_v": d_v, "P_drop": config.dropout, "ε_ls": result["label_smoothing"],
            "positional": config.positional}


def table_markdown(results: dict[str, dict]) -> str:
    """The paper's layout: the base row in full, the others only where they differ from it;
    ours beside the paper's perplexity, BLEU and parameters."""
    base = cells(results["base"]) if "base" in results else {}
    header = ["row", *COLUMNS, "steps", "PPL (dev)", "BLEU (dev)", "params ×10⁶", "paper PPL", "paper BLEU",
              "paper params ×10⁶"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in ROWS:
        if row not in results:
            continue
        result, paper, params_m = results[row], PAPER[paper_name(row)], PAPER_PARAMS_M.get(row)
        mine = cells(result)
        shown = [str(mine[c]) if row in ("base", REPEAT) or mine[c] != base.get(c) else "" for c in COLUMNS]
        name = row if mine["positional"] == base.get("positional", "sinusoidal") else f"{row} (learned positions)"
        paper_cells = ["", "", ""] if row == REPEAT else [
            f"{paper.ppl:.2f}", f"{paper.bleu:.1f}", "" if params_m is None else f"{params_m:.0f}"]
        lines.append("| " + " | ".join([name, *shown, str(result["steps"]), f"{result['dev_ppl']:.2f}",
                                         f"{result['dev_bleu']:.1f}", f"{result['params'] / 1e6:.2f}",
                                         *paper_cells]) + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Claim:
    """One of the paper's conclusions from Table 3: each pair is (worse row, better row), judged
    on `metrics`; with `same`, the rows of each pair are about as good as each other."""

    text: str
    pairs: tuple[tuple[str, str], ...]
    metrics: tuple[str, ...] = ("dev_ppl", "dev_bleu")
    same: bool = False


CLAIMS = (
    Claim("a single head is worse than 8 (A1 vs base)", (("A1", "base"),)),
    Claim("too many heads are worse: 32 heads vs 8 (A4 vs base)", (("A4", "base"),)),
    Claim("smaller keys d_k hurt (B1, B2 vs base)", (("B1", "base"), ("B2", "base"))),
    Claim("fewer layers are worse (C1, C2 vs base)", (("C1", "base"), ("C2", "base"))),
    # The paper's own C3 is better by perplexity only (4.88 against 4.92; BLEU 25.5 against 25.8).
    Claim("more layers lower perplexity (C3 vs base)", (("base", "C3"),), metrics=("dev_ppl",)),
    Claim("narrower models are worse (C4 d_model, C6 d_ff vs base)", (("C4", "base"), ("C6", "base"))),
    Claim("wider models are better (C5 d_model, C7 d_ff vs base)", (("base", "C5"), ("base", "C7"))),
    Claim("dropout helps (D1, no dropout, vs base)", (("D1", "base"),)),
    # §5.4: label smoothing "hurts perplexity, as the model learns to be more unsure, but
    # improves accuracy and BLEU score".
    Claim("label smoothing hurts perplexity (D3, ε_ls 0, vs base)", (("base", "D3"),), metrics=("dev_ppl",)),
    Claim("... but improves BLEU (D3 vs base)", (("D3", "base"),), metrics=("dev_bleu",)),
    Claim("learned positions are about as good as sinusoids (E vs base)", (("E", "base"),), same=True),
)


def noise_floor(results: dict[str, dict]) -> tuple[float, float]:
    """(perplexity, BLEU) distance between the two seeds of the base row; 0 without the repeat."""
    if "base" in results and REPEAT in results:
        a, b = results["base"], results[REPEAT]
        return abs(a["dev_ppl"] - b["dev_ppl"]), abs(a["dev_bleu"] - b["dev_bleu"])
    return 0.0, 0.0


def reference(results: dict[str, dict]) -> dict[str, dict]:
    """The results with the base row as the mean of its two seeds, when both are done: the
    rows are judged against the base, not against whichever seed happened to land lower."""
    if "base" not in results or REPEAT not in results:
        return results
    a, b = results["base"], results[REPEAT]
    return {**results, "base": {**a, "dev_ppl": (a["dev_ppl"] + b["dev_ppl"]) / 2,
                                "dev_bleu": (a["dev_bleu"] + b["dev_bleu"]) / 2}}


def _value(result: dict, metric: str) -> str:
    return f"{result[metric]:.2f}" if metric == "dev_ppl" else f"{result[metric]:.1f}"


def _verdict(results: dict[str, dict], claim: Claim, metric: str, noise: float) -> str:
    """'yes' when every pair goes the paper's way by more than the noise, 'no' when one goes the
    other way by more than the noise, else 'within noise', or 'equal' where the noise floor was
    not measured (for `same`: 'yes' when every pair is within the noise, and 'not judged'
    without a noise floor, where only exact equality would do); then the values it was judged
    on."""
    signs = []
    for worse, better in claim.pairs:
        gap = results[worse][metric] - results[better][metric]
        gap = gap if metric == "dev_ppl" else -gap  # > 0: the paper's way
        signs.append(0 if abs(gap) <= noise else (1 if gap > 0 else -1))
    if claim.same:
        verdict = ("yes" if all(s == 0 for s in signs) else "no") if REPEAT in results else "not judged (no noise floor)"
    elif any(s < 0 for s in signs):
        verdict = "no"
    else:
        verdict = "yes" if all(s > 0 for s in signs) else ("within noise" if REPEAT in results else "equal")
    rows = list(dict.fromkeys(row for pair in claim.pairs for row in pair))
    return f"{verdict} ({', '.join(f'{row} {_value(results[row], metric)}' for row in rows)})"


def findings(results: dict[str, dict]) -> list[dict]:
    """For each of the paper's conclusions whose rows are done: the paper's own values, and
    whether ours agree by dev perplexity and by dev BLEU. Differences within the two-seed noise
    floor count as neither way."""
    noise = dict(zip(("dev_ppl", "dev_bleu"), noise_floor(results)))
    results = reference(results)
    found = []
    for claim in CLAIMS:
        rows = list(dict.fromkeys(row for pair in claim.pairs for row in pair))
        if not all(row in results for row in rows):
            continue
        paper_values = {row: {"dev_ppl": PAPER[row].ppl, "dev_bleu": PAPER[row].bleu} for row in rows}
        paper = ", ".join(f"{row} " + " / ".join(_value(paper_values[row], m) for m in claim.metrics) for row in rows)
        found.append({"claim": claim.text, "paper": paper,
                      **{m: (_verdict(results, claim, m, noise[m]) if m in claim.metrics else "-")
                         for m in ("dev_ppl", "dev_bleu")}})
    return found


def findings_markdown(results: dict[str, dict]) -> str:
    ppl_noise, bleu_noise = noise_floor(results)
    floor = (f"perplexity {ppl_noise:.2f}, BLEU {bleu_noise:.2f}" if REPEAT in results and "base" in results
             else "not measured (needs rows base and base-seed2): every difference counts")
    lines = [f"Noise floor (base vs {REPEAT}): {floor}. The rows are judged against the base's mean over its "
             f"seeds; a difference within the noise floor counts as neither way.", "",
             "| the paper's conclusion | the paper's rows | ours, by dev perplexity | ours, by dev BLEU |",
             "|---|---|---|---|"]
    lines += [f"| {f['claim']} | {f['paper']} | {f['dev_ppl']} | {f['dev_bleu']} |" for f in findings(results)]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, results: dict[str, dict], corpus: str = "bible-en-es") -> None:
    """OUT/table3.md (table and findings), OUT/table3.json and OUT/table3.png (of the rows trained
    on `corpus`), from every finished row; rewritten after each row, so a stopped experiment
    still has its table."""
    text = table_markdown(results) + "\n" + findings_markdown(results)
    atomic_write(out / TABLE_MD, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    paper = {row: {**dataclasses.asdict(values), "params_m": PAPER_PARAMS_M.get(row)} for row, values in PAPER.items()}
    write_json(out / TABLE_JSON, {"rows": results, "paper": paper,
                                  "findings": findings(results)})
    plot_table(results, out / TABLE_PNG, corpus)


def plot_table(results: dict[str, dict], path: Path, corpus: str = "bible-en-es") -> None:
    """`table_figure`, written to `path` (nothing without the base row)."""
    import matplotlib.pyplot as plt

    if (fig := table_figure(results, corpus)) is None:
        return
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def table_figure(results: dict[str, dict], corpus: str = "bible-en-es"):
    """Each row's change against its own base row, ours beside the paper's: dev perplexity as a
    ratio to the base's (log scale: × and ÷ are symmetric) and dev BLEU as a difference; None
    without the base row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if "base" not in results:
        return None
    rows = [row for row in ROWS if row in results]
    base, paper_base = reference(results)["base"], PAPER["base"]
    ours_ppl = [results[r]["dev_ppl"] / base["dev_ppl"] for r in rows]
    paper_ppl = [PAPER[paper_name(r)].ppl / paper_base.ppl for r in rows]
    ours_bleu = [results[r]["dev_bleu"] - base["dev_bleu"] for r in rows]
    paper_bleu = [PAPER[paper_name(r)].bleu - paper_base.bleu for r in rows]
    ppl_noise, bleu_noise = noise_floor(results)
    ppl_band = 1 + ppl_noise / base["dev_ppl"]
    x = range(len(rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7.0, 0.5 * len(rows) + 2), 7), sharex=True)
    for ax, ours, paper, label, band in ((top, ours_ppl, paper_ppl, "dev perplexity / base's", (1 / ppl_band, ppl_band)),
                                         (bottom, ours_bleu, paper_bleu, "dev BLEU − base's", (-bleu_noise, bleu_noise))):
        zero = 1.0 if ax is top else 0.0  # bars start at "same as the base"
        if band[1] > zero:
            ax.axhspan(*band, color="#2a7ab9", alpha=0.12, label="ours: ± the gap between the base's two seeds")
        ax.bar([i - 0.2 for i in x], [v - zero for v in paper], 0.4, bottom=zero,
               label="paper (100K steps, WMT14 en-de)", color="#888888")
        ax.bar([i + 0.2 for i in x], [v - zero if math.isfinite(v) else 0.0 for v in ours], 0.4, bottom=zero,
               label=f"aiayn miniature ({base['steps']} steps, {Path(corpus).name or corpus})", color="#2a7ab9")
        for i in (i for i, v in enumerate(ours) if not math.isfinite(v)):  # a diverged row has no bar: said (found in review)
            ax.annotate("not finite", (i + 0.2, zero), rotation=90, ha="center", va="bottom", fontsize=8, color="#b22222")
        ax.axhline(zero, color="black", linewidth=0.8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    top.set_yscale("log")
    # Ratios near 1 span a small part of a decade, where log ticks would be few, or many labelled
    # alike at two digits (found in review): evenly spaced ratios, with the digits that tell them apart.
    top.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]))
    top.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter(useOffset=False))
    top.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    seeds = "the mean of its two seeds" if REPEAT in results else "one seed"
    top.set_title(f"Table 3: each row against the base\n(ours: {seeds}; perplexity: lower is better)")
    top.legend(fontsize=8)
    bottom.set_xticks(list(x), rows, rotation=45)
    fig.tight_layout()
    return fig
