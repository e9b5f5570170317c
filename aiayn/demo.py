"""`aiayn demo`: the main job on the built-in default. Train the `small` preset on bible-en-es for
a time budget, average the last checkpoints and translate the held-out test books with beam
search (§6.1), score them and draw the attention of one verse. Run again, it resumes the run
until the budget is spent, then only averages and translates."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path

import torch

from aiayn import __version__
from aiayn.config import (DEMO_AVERAGE_LAST, DEMO_RECIPE, DecodeConfig, DemoOptions, demo_model, demo_training,
                          preset_training, recipe)
from aiayn.device import cpu_kind, matmul_peak_flops, resolve_device, resolve_precision
from aiayn.errors import one_process
from aiayn.evaluate import score
from aiayn.files import read_json, write_json
from aiayn.model import Transformer
from aiayn.run import DEMO_RESULT, RunDir, average_checkpoints
from aiayn.train import RERUN_HINT, train_run
from aiayn.translate import Translator, cut_at_limit
from aiayn.visualize import attention_figures


def run_demo(options: DemoOptions, decode: DecodeConfig) -> None:
    one_process("demo")
    run = RunDir(options.out)
    with run.lock():  # held from the training to the last attention map
        _demo(options, decode, run)


def _check_new_run(run: RunDir) -> None:
    """A new run ends by making averaged/ and attention/ anew: in a folder of the user's, those
    must not be the user's (found in review: they were deleted, without --force)."""
    if held := [path.name for path in (run.averaged, run.attention, run.path / DEMO_RESULT) if path.exists()]:
        raise ValueError(f"{run.path} holds {', '.join(held)}, which a new demo run there would replace; "
                         "choose another --out")


def _demo(options: DemoOptions, decode: DecodeConfig, run: RunDir) -> None:
    resume = run.has_configs()
    model_config = demo_model(options.preset, options.recipe)
    precision = resolve_precision(options.precision, resolve_device("auto"))
    changes = preset_training(options.preset)  # D3's and D4's ε_ls, which no model config holds
    if resume:  # the run goes on as it began: its model and recipe, a new budget
        smoothing = demo_training(options.recipe, **changes).label_smoothing
        asked, (model_config, training) = (model_config, precision, options.seed, smoothing), run.configs()
        if (training.data, training.corpus) != (None, DEMO_RECIPE["corpus"]):  # it would end with no test verses
            raise ValueError(f"{run.path} is a run on {training.data or training.corpus}, not the demo's "
                             f"{DEMO_RECIPE['corpus']}; choose another --out (or aiayn train --resume for that run)")
        if asked != (model_config, training.precision, training.seed, training.label_smoothing):
            print(f"note: {run.path} goes on with the model, recipe, precision and seed it began with; "
                  f"--preset, --recipe, --precision and --seed apply to a new --out")  # in order with its report
        training = dataclasses.replace(training, minutes=options.minutes)
    else:
        _check_new_run(run)
        training = demo_training(options.recipe, minutes=options.minutes, precision=precision, seed=options.seed,
                                 **changes)
        print(f"recipe {options.recipe}: {recipe(options.recipe).about}")
    trainer, store = train_run(model_config, training, run, resume=resume, resume_hint=RERUN_HINT)
    model, tokenizer = trainer.model.eval(), trainer.tokenizer
    if DEMO_AVERAGE_LAST:  # §6.1: the mean of the last checkpoints translates
        chosen = run.checkpoints()[-DEMO_AVERAGE_LAST:]
        average_checkpoints(chosen, run.averaged, force=True)  # made anew from this run's checkpoints
        model = Transformer.load(run.averaged, trainer.device).eval()
        which = f"{len(chosen)} checkpoints ({chosen[0].name} ... {chosen[-1].name})" if len(chosen) > 1 else \
            f"checkpoint ({chosen[0].name})"
        print(f"averaged the last {which} into {run.averaged}")
    test = store.texts("test")[: options.test_sentences]
    decode = dataclasses.replace(decode, precision=training.precision)
    print(f"translating {len(test):,} test verses (beam {decode.beam}, α {decode.alpha}, "
          f"max length = source + {decode.extra_len})...")
    translator = Translator(model, tokenizer, decode)
    result = score(translator, test, lang=store.tgt_lang, progress=True)
    print(f"test BLEU {result.bleu:.1f} ({result.signature}); chrF {result.chrf:.1f}; "
          f"paper protocol {result.paper_bleu:.1f}; {len(test) / result.seconds:.1f} sentences/s")
    # What the figure depends on: the steps the budget bought on this machine (the peak was
    # measured by the training itself, and is cached).
    peak = matmul_peak_flops(trainer.device, training.precision)
    print(f"machine: {cpu_kind()}, {torch.get_num_threads()} threads, {training.precision} matmul peak "
          f"{peak / 1e12:.2f} TFLOP/s; {trainer.step:,} steps")
    # A row of the README's demo table, kept with the run: committed under benchmarks/results, it
    # is that row's source.
    kept = read_json(run.path / DEMO_RESULT) if (run.path / DEMO_RESULT).exists() else {}
    # A score on fewer verses never replaces one on more (found in review: the README's row source).
    figures = run.path / (DEMO_RESULT if kept.get("test_sentences", 0) <= len(test) else f"demo-{len(test)}-verses.json")
    write_json(figures, {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "aiayn": __version__,
        "cpu_kind": cpu_kind(), "threads": torch.get_num_threads(), "precision": training.precision,
        "bf16_weights": training.bf16_weights, "norm_first": model_config.norm_first,
        "matmul_peak_tflops": peak / 1e12, "parameters": model.num_parameters(),
        "training_minutes": trainer.elapsed / 60, "steps": trainer.step, "test_sentences": len(test),
        "test_bleu": result.bleu, "bleu_signature": result.signature, "test_chrf": result.chrf,
        "paper_protocol_bleu": result.paper_bleu,
        "sentences_per_s": len(test) / result.seconds})
    print(f"these figures: {figures}" + ("" if figures.name == DEMO_RESULT else
                                          f" ({DEMO_RESULT} keeps the score on {kept['test_sentences']:,} verses)"))
    samples = list(range(0, len(test), max(1, len(test) // 4)))[:4]
    for i in samples:
        print(f"\n  source     {test[i][0]}\n  reference  {test[i][1]}\n  aiayn      {result.hypotheses[i]}")
    shortest = min(samples, key=lambda i: len(result.hypotheses[i]))
    paths = _attention_maps(translator, test[shortest][0], run.attention)
    print(f"\nattention maps of test verse {shortest + 1}: {paths[-1].parent}/ ({len(paths)} files)")


def _attention_maps(translator: Translator, source: str, out: Path) -> list[Path]:
    """The maps of `source` and its translation, drawn with the weights the search saw, a
    translation cut at its length limit named so (found in review: neither was)."""
    ids = translator.tokenizer.encode(source)
    target = translator.translate_ids([ids])[0]
    return attention_figures(translator.model, translator.tokenizer, source, target, out, force=True,
                             cut=cut_at_limit(translator.model.config, ids, target, translator.decode))
