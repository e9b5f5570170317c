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
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from aiayn.config import (BASE, DECODE_PRESETS, PRESETS, SEED_LIMIT, TRAIN_OVERRIDES, ModelConfig,
                          TrainConfig, check_whole)
from aiayn.errors import one_process
from aiayn.files import read_json, write_json
from aiayn.run import EXPERIMENT, LOCK, ROW_RESULT, RunDir
from aiayn.table3 import REPEAT, ROWS, paper_name, write_outputs

DATA = "data"
Languages = tuple[Optional[str], Optional[str]]  # (source, target) of a corpus; None: as its files say

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
        changed = sorted(key for key in set(kept) | set(settings) if kept.get(key) != settings.get(key)
                         and not (key == "corpus" and Path(str(kept.get(key))).resolve() == Path(settings[key]).resolve()))
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
    from aiayn.batching import within_length
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
        # (found by a misuse hunt: the first row trained, then its validation divided by zero)
        limit = TrainConfig.max_sentence_tokens  # the rows' own
        if not len(within_length(store.split("dev").lengths, limit)):
            shutil.rmtree(folder)
            raise ValueError(f"Table 3 scores every row on its corpus's dev split, and every dev pair of {corpus} is "
                             f"longer than {limit} tokens, which training leaves out: give a dev split of sentences")


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
        corpus=corpus, data=str((out / DATA).absolute()), max_tokens=scale.max_tokens, warmup_steps=scale.warmup_steps,
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
    scoring = time.perf_counter()
    echo(f"translating {len(pairs)} dev sentences (beam 4, α 0.6)...")
    decode = dataclasses.replace(DECODE_PRESETS["translate"], precision=precision)  # §6.1: beam 4, α = 0.6
    dev_bleu = score(Translator(trainer.model, trainer.tokenizer, decode), pairs, progress=True)
    result = {
        "row": row, "config": config.to_dict(), "label_smoothing": recipe.label_smoothing, "steps": trainer.step,
        "dev_ppl": dev["ppl"], "dev_bleu": dev_bleu.bleu, "bleu_signature": dev_bleu.signature, "dev_sentences": len(pairs),
        "params": trainer.model.num_parameters(), "seconds": round(time.perf_counter() - start, 1),
        # Every session's training (a resumed row's `seconds` holds its last session only; found by a misuse hunt)
        "training_seconds": round(trainer.elapsed, 1), "scoring_seconds": round(time.perf_counter() - scoring, 1),
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

    one_process("experiment table3")
    if scale_name not in SCALES:
        raise ValueError(f"unknown scale {scale_name!r}; choose from {', '.join(SCALES)}")
    scale = SCALES[scale_name]
    check_whole(seed=seed, **{name: value for name, value in {"steps": steps, "vocab_size": vocab_size}.items() if value is not None})
    # base-seed2 trains with seed + 1; checked before the settings bind the folder (found by a misuse hunt)
    if not 0 <= seed <= SEED_LIMIT - 2:
        raise ValueError(f"--seed (in Python: seed=) must be between 0 and {SEED_LIMIT - 2:,}, got {seed}")
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
    from aiayn.prepare import recorded_corpus

    corpus = recorded_corpus(corpus)  # "DIR/", "./DIR" and its absolute path are one (found by a misuse hunt)
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
        write_outputs(out, done, corpus)
    if not todo:
        write_outputs(out, done, corpus)
    return done


__all__ = ["SCALES", "Scale", "miniature", "select_rows", "run_table3", "read_results"]
