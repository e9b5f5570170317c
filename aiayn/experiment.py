"""Table 3 of Vaswani et al. (2017) as an experiment: the base model and every variation of §6.2,
trained in miniature for the same number of steps each, scored as the paper scored them (dev
perplexity per BPE piece, dev BLEU with beam 4 and α 0.6, no checkpoint averaging), and printed
beside the paper's own numbers.

A miniature applies each row's *change* to a small base: every width (d_model, d_ff, d_k, d_v)
shrinks by one factor, every depth N by another, while h, P_drop, ε_ls and the positional
encoding keep the paper's values. Row A thus still holds h·d_k = d_model while h goes 1 → 32,
row B still cuts d_k to 1/4 and 1/2 of the base's, and row C still spans 1/3 to 4/3 of the
base's depth and 1/2 to 2× its widths.

Every row is a run folder OUT/<row> trained by `aiayn.train`; OUT/<row>/result.json marks it
done, so a killed experiment continues with the rows not yet done (and the row it was in
resumes from its last checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from aiayn.config import (BASE, DECODE_PRESETS, PAPER_PARAMS_M, PRESETS, TRAIN_OVERRIDES, ModelConfig, TrainConfig,
                          check_whole)
from aiayn.files import atomic_write, read_json, write_json
from aiayn.run import EXPERIMENT, LOCK, ROW_RESULT, RunDir

DATA = "data"
Languages = tuple[Optional[str], Optional[str]]  # (source, target) of a corpus; None: as its files say
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


@dataclass(frozen=True)
class Scale:
    """How small the miniature is, and how it trains. Widths shrink by d_model / 512, depths are
    divided by `depth_divisor` (the paper's N of 2, 4, 6, 8 must stay whole numbers)."""

    d_model: int
    depth_divisor: int
    vocab_size: int
    steps: int  # per row, the same for every row as the paper's 100K
    max_tokens: int
    warmup_steps: int
    lr_scale: float
    dev_bleu_sentences: Optional[int]  # None: the whole dev split


SCALES = {
    # ~2.4M parameters at the base row; 800 steps of 3,000-token batches take ~5 minutes on a
    # 2-core CPU in bf16, so the 20 rows fit in about two hours. The optimiser settings are the
    # demo's, the recipe this corpus and machine were tuned with.
    "small": Scale(d_model=128, depth_divisor=2, vocab_size=8000, steps=800, max_tokens=3000, warmup_steps=300,
                   lr_scale=0.5, dev_bleu_sentences=None),
    # For the tests: seconds per row.
    "tiny": Scale(d_model=32, depth_divisor=2, vocab_size=1000, steps=4, max_tokens=600, warmup_steps=2,
                  lr_scale=1.0, dev_bleu_sentences=8),
}


def miniature(row: str, scale: Union[Scale, str]) -> tuple[ModelConfig, dict]:
    """The model config of a Table 3 row at `scale` (a Scale, or its name in SCALES), and the
    training settings the row changes (ε_ls of rows D3 and D4)."""
    if row not in ROWS:
        raise ValueError(f"unknown Table 3 row {row!r}; choose from {', '.join(ROWS)}")
    if isinstance(scale, str):  # a scale's name, as run_table3 takes
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
        scale = SCALES[scale]
    if not isinstance(scale, Scale):  # (found in review: None was an AttributeError)
        raise TypeError(f"scale takes a Scale or its name ({', '.join(SCALES)}), not a {type(scale).__name__}")
    paper = PRESETS[paper_name(row)]
    if BASE.d_model % scale.d_model:
        raise ValueError(f"a scale's d_model must divide {BASE.d_model}, got {scale.d_model}")
    shrink = BASE.d_model // scale.d_model

    def narrow(width: int) -> int:
        if width % shrink:
            raise ValueError(f"row {row}: width {width} does not shrink by {shrink}")
        return width // shrink

    if paper.n_layers % scale.depth_divisor:
        raise ValueError(f"row {row}: N={paper.n_layers} does not divide by {scale.depth_divisor}")
    d_k, d_v = paper.head_dims
    config = dataclasses.replace(
        paper, vocab_size=scale.vocab_size, d_model=narrow(paper.d_model), d_ff=narrow(paper.d_ff),
        d_k=narrow(d_k), d_v=narrow(d_v), n_layers=paper.n_layers // scale.depth_divisor,
    )
    return config, dict(TRAIN_OVERRIDES.get(row, {}))


def select_rows(names: Optional[Sequence[str]]) -> list[str]:
    """Row names from `--rows`: a row (A1, base, base-seed2) or a group letter (A, B, C, D, E);
    the paper's order, each row once."""
    if names is None:
        return list(ROWS)
    if not names:  # (found in review: rows=[] ran all 20 rows, hours at the default scale)
        raise ValueError("no Table 3 rows given: name some (rows=['base', 'A']), or pass rows=None for all of them")
    names = [names] if isinstance(names, str) else names  # "base", not "b", "a", "s", "e"
    chosen = set()
    for name in names:
        matched = [row for row in ROWS if row == name or (len(name) == 1 and row[0] == name and row[0] in "ABCDE")]
        if not matched:
            raise ValueError(f"unknown Table 3 row {name!r}; choose from {', '.join(ROWS)} or a group A-E")
        chosen.update(matched)
    return [row for row in ROWS if row in chosen]


def _settings(scale_name: str, scale: Scale, precision: str, seed: int, corpus: str,
              languages: Languages = (None, None)) -> dict:
    return {"experiment": "table3", "scale": scale_name, **dataclasses.asdict(scale), "precision": precision,
            "seed": seed, "corpus": corpus, "src_lang": languages[0], "tgt_lang": languages[1]}


def _check_out(out: Path, settings: dict) -> None:
    """An experiment folder holds one set of settings: rows trained otherwise would not compare."""
    path = out / EXPERIMENT
    if path.exists():
        kept = read_json(path)
        changed = sorted(key for key in set(kept) | set(settings) if kept.get(key) != settings.get(key))
        if changed and _started(out):
            first = "scale" if "scale" in changed else changed[0]  # the scale sets most of the others
            raise ValueError(f"{out} holds an experiment with {first}={kept.get(first)!r}, not {settings.get(first)!r}; "
                             f"continue it with its settings or choose another --out (in Python: out=...)")
    elif out.exists() and any(p.name != LOCK for p in out.iterdir()):  # its lock: a start that failed
        raise ValueError(f"{out} exists and is not a Table 3 experiment folder; choose another --out (in Python: out=...)")
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, settings)


def _started(out: Path) -> bool:
    """Whether the experiment in `out` has data or rows: else its settings are those of a start
    that failed before any work (an unknown corpus, say), and the next start may set them anew."""
    from aiayn.store import load_store

    try:
        load_store(out / DATA)
        return True
    except (ValueError, OSError):
        return any((out / row).exists() for row in ROWS)


def _prepare_data(out: Path, corpus: str, languages: Languages, scale: Scale, echo: Callable[[str], None]) -> None:
    """One preprocessed copy of the corpus for every row, so all rows see the same pieces;
    `languages` (source, target) name a folder's languages where its files do not tell."""
    from aiayn.corpora import stream_corpus
    from aiayn.store import load_store, preprocess

    folder = out / DATA
    try:
        load_store(folder)
    except (ValueError, OSError):
        store = preprocess(stream_corpus(corpus, *languages), folder, scale.vocab_size, spec=corpus, force=True, echo=echo)
        if "dev" not in store.splits:  # found in review: the first row's scoring divided by zero
            shutil.rmtree(folder)  # data that no row can use: the experiment has not started
            raise ValueError(f"Table 3 scores every row on its corpus's dev split, and {corpus} has none: give a "
                             "folder with train.SRC, train.TGT, dev.SRC and dev.TGT (or train.tsv and dev.tsv)")


def run_row(row: str, out: Path, scale: Scale, precision: str, seed: int, corpus: str,
            echo: Callable[[str], None] = print) -> dict:
    """Train one row (resuming its run folder when it has one), then score it on the dev split;
    the result is written to OUT/<row>/result.json."""
    import torch

    from aiayn.device import cpu_kind, matmul_peak_flops
    from aiayn.evaluate import score
    from aiayn.train import RERUN_HINT, train_run
    from aiayn.translate import Translator

    config, overrides = miniature(row, scale)
    run = RunDir(out / row)
    if run.has_configs():  # a row begun before the paper's bias-free attention goes on with its biases
        config = dataclasses.replace(config, attention_bias=run.configs()[0].attention_bias)
    recipe = TrainConfig(
        corpus=corpus, data=str(out / DATA), max_tokens=scale.max_tokens, warmup_steps=scale.warmup_steps,
        lr_scale=scale.lr_scale, max_steps=scale.steps, save_every=max(1, scale.steps // 4), keep_last=1,
        log_every=max(1, scale.steps // 12), eval_every=max(1, scale.steps // 4), eval_bleu_sentences=0,
        seed=seed + 1 if row == REPEAT else seed, precision=precision, **overrides,
    )
    start = time.perf_counter()
    trainer, _ = train_run(config, recipe, run, resume=run.has_configs(), echo=echo, resume_hint=RERUN_HINT)
    # fit() validates its last step when eval_every divides the steps; a row resumed after its
    # training ended has no such record yet.
    logged = [r for r in run.read_log(echo) if r["split"] == "dev" and r["step"] == trainer.step]
    dev = logged[-1] if logged else trainer.validate()
    count = len(trainer.data.dev_text) if scale.dev_bleu_sentences is None else scale.dev_bleu_sentences
    pairs = trainer.data.dev_text[:count]
    echo(f"translating {len(pairs)} dev sentences (beam 4, α 0.6)...")
    decode = dataclasses.replace(DECODE_PRESETS["translate"], precision=precision)  # §6.1: beam 4, α = 0.6
    dev_bleu = score(Translator(trainer.model, trainer.tokenizer, decode), pairs, progress=True)
    result = {
        "row": row, "config": config.to_dict(), "label_smoothing": recipe.label_smoothing, "steps": trainer.step,
        "dev_ppl": dev["ppl"], "dev_bleu": dev_bleu.bleu, "bleu_signature": dev_bleu.signature, "dev_sentences": len(pairs),
        "params": trainer.model.num_parameters(), "seconds": round(time.perf_counter() - start, 1),
        # The speed its seconds depend on (measured by the training, cached; found in review: not recorded)
        "machine": {"cpu_kind": cpu_kind(), "device": str(trainer.device), "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "matmul_peak_tflops": matmul_peak_flops(trainer.device, trainer.recipe.precision) / 1e12},
    }
    write_json(run.path / ROW_RESULT, result)
    return result


def read_results(out: Path) -> dict[str, dict]:
    """The finished rows of an experiment folder, by row name."""
    return {row: read_json(out / row / ROW_RESULT) for row in ROWS if (out / row / ROW_RESULT).exists()}


def run_table3(out: Path, scale_name: str = "small", rows: Optional[Sequence[str]] = None, steps: Optional[int] = None,
               precision: str = "auto", seed: int = 1, corpus: str = "bible-en-es", vocab_size: Optional[int] = None,
               echo: Callable[[str], None] = print, src_lang: Optional[str] = None,
               tgt_lang: Optional[str] = None) -> dict[str, dict]:
    """Train and score the chosen rows (default: all) in OUT, skipping the ones already done,
    and write the table, its JSON and its plot after each row. Returns every finished row.
    `steps` and `vocab_size` replace the scale's; `src_lang` and `tgt_lang` name the languages
    of a corpus whose files do not (found in a docs audit: a folder of train.en and train.es
    could not be given, the error naming flags that table3 lacked)."""
    from aiayn.device import check_precision, resolve_device, resolve_precision

    if scale_name not in SCALES:
        raise ValueError(f"unknown scale {scale_name!r}; choose from {', '.join(SCALES)}")
    scale = SCALES[scale_name]
    check_whole(seed=seed, **{name: value for name, value in {"steps": steps, "vocab_size": vocab_size}.items() if value is not None})
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps (in Python: steps=) must be at least 1, got {steps}")
        scale = dataclasses.replace(scale, steps=steps)
    if vocab_size is not None:
        if vocab_size < 1:
            raise ValueError(f"--vocab-size (in Python: vocab_size=) must be at least 1, got {vocab_size}")
        scale = dataclasses.replace(scale, vocab_size=vocab_size)
    chosen = select_rows(rows)
    device = resolve_device("auto")
    precision = resolve_precision(precision, device)
    check_precision(device, precision)
    out = Path(out)
    with RunDir(out).lock():  # the settings too: a refused second start must not rewrite them
        _check_out(out, _settings(scale_name, scale, precision, seed, corpus, (src_lang, tgt_lang)))
        try:
            return _run_rows(out, chosen, scale, scale_name, precision, seed, corpus, (src_lang, tgt_lang), echo)
        except BaseException:
            if not _started(out):  # settings that bound nothing: a new folder goes whole (RunDir.lock)
                (out / EXPERIMENT).unlink(missing_ok=True)
            raise


def _run_rows(out: Path, chosen: list[str], scale: Scale, scale_name: str, precision: str, seed: int, corpus: str,
              languages: Languages, echo: Callable[[str], None]) -> dict[str, dict]:
    """`run_table3`'s work, under the experiment folder's lock."""
    _prepare_data(out, corpus, languages, scale, echo)
    done = read_results(out)
    todo = [row for row in chosen if row not in done]
    echo(f"Table 3 at scale {scale_name}: {len(chosen) - len(todo)} of {len(chosen)} rows done, "
         f"{scale.steps} steps each, in {out}")
    for row in todo:
        prefix = f"[{row} {chosen.index(row) + 1}/{len(chosen)}] "  # as a first start numbers it
        echo(f"{prefix}training {scale.steps} steps")
        try:
            done[row] = run_row(row, out, scale, precision, seed, corpus, echo=lambda line: echo(prefix + line))
        except KeyboardInterrupt:
            echo(f"stopped in row {row}; the same command continues the experiment from there")
            raise
        echo(f"{prefix}dev perplexity {done[row]['dev_ppl']:.2f}, dev BLEU {done[row]['dev_bleu']:.1f}")
        write_outputs(out, done)
    if not todo:
        write_outputs(out, done)
    return done


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


def write_outputs(out: Path, results: dict[str, dict]) -> None:
    """OUT/table3.md (table and findings), OUT/table3.json and OUT/table3.png, from every
    finished row; rewritten after each row, so a stopped experiment still has its table."""
    text = table_markdown(results) + "\n" + findings_markdown(results)
    atomic_write(out / TABLE_MD, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    paper = {row: {**dataclasses.asdict(values), "params_m": PAPER_PARAMS_M.get(row)} for row, values in PAPER.items()}
    write_json(out / TABLE_JSON, {"rows": results, "paper": paper,
                                  "findings": findings(results)})
    plot_table(results, out / TABLE_PNG)


def plot_table(results: dict[str, dict], path: Path) -> None:
    """`table_figure`, written to `path` (nothing without the base row)."""
    import matplotlib.pyplot as plt

    if (fig := table_figure(results)) is None:
        return
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def table_figure(results: dict[str, dict]):
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
               label=f"aiayn miniature ({base['steps']} steps, bible-en-es)", color="#2a7ab9")
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
    top.set_title("Table 3: each row against the base\n(ours: the mean of its two seeds; perplexity: lower is better)")
    top.legend(fontsize=8)
    bottom.set_xticks(list(x), rows, rotation=45)
    fig.tight_layout()
    return fig


__all__ = ["PAPER", "ROWS", "SCALES", "Scale", "miniature", "select_rows", "run_table3", "read_results",
           "table_markdown", "findings", "plot_table", "table_figure"]
