"""The `aiayn` command line: one program, one subcommand per job.

Model options are derived from the `ModelConfig` dataclass fields (`--d-model 256`,
`--positional learned`, ...), so the API, the CLI and the saved config share one definition.
User mistakes end with a one-line `aiayn: error: ...` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing
from pathlib import Path
from typing import Optional, Sequence

import torch

from aiayn.config import PAPER_PARAMS_M, PRESETS, TRAIN_OVERRIDES, ModelConfig, TrainConfig, preset
from aiayn.flops import forward_flops, training_flops


class UserError(Exception):
    """A mistake in the user's input: reported in one line, exit status 2."""


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, title: str) -> None:
    """One `--field-name VALUE` option per field of the dataclass `cls` (default: unset)."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        kwargs: dict = {"dest": f"{cls.__name__}.{f.name}", "default": None, "metavar": f.name.upper()}
        args = typing.get_args(hint)
        if typing.get_origin(hint) is typing.Literal:
            kwargs.update(choices=args, metavar=None)
        elif hint is bool:
            kwargs["type"] = _parse_bool
        else:
            kwargs["type"] = next((a for a in args if a is not type(None)), hint)
        group.add_argument(f"--{f.name.replace('_', '-')}", **kwargs)


def given_fields(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that the command line set."""
    values = {f.name: getattr(args, f"{cls.__name__}.{f.name}") for f in dataclasses.fields(cls)}
    return {name: value for name, value in values.items() if value is not None}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--preset NAME` plus one option per ModelConfig field."""
    parser.add_argument("--preset", default="base", help=f"model preset: {', '.join(PRESETS)} (default: base)")
    add_dataclass_arguments(parser, ModelConfig, "model options (override the preset)")


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    return dataclasses.replace(preset(args.preset), **given_fields(args, ModelConfig))


def _millions(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def cmd_info(args: argparse.Namespace) -> None:
    """Print a preset's configuration, parameter count and FLOPs per token."""
    from aiayn.model import Transformer

    config = config_from_args(args)
    if args.length < 1:
        raise UserError("--length must be at least 1")
    with torch.device("meta"):  # shapes only: even `big` costs no memory
        model = Transformer(config)
    encoder = sum(p.numel() for n, p in model.encoder.named_parameters() if not n.startswith("embed."))
    decoder = sum(p.numel() for n, p in model.decoder.named_parameters() if not n.startswith("embed."))
    total = model.num_parameters()
    d_k, d_v = config.head_dims
    print(f"preset {args.preset}")
    for key, value in config.to_dict().items():
        if key in ("d_k", "d_v"):
            value = {"d_k": d_k, "d_v": d_v}[key] if value is None else value
        print(f"  {key:18} {value}")
    print(f"parameters         {total:,} ({_millions(total)})")
    print(f"  embeddings       {total - encoder - decoder:,}")
    print(f"  encoder          {encoder:,}")
    print(f"  decoder          {decoder:,}")
    if args.preset in PAPER_PARAMS_M and config == PRESETS[args.preset]:
        print(f"  paper (Table 3)  {PAPER_PARAMS_M[args.preset]:.0f}M")
    length = args.length
    forward = forward_flops(config, length, length)
    print(f"FLOPs per target token (sentence pairs of {length} + {length} tokens)")
    print(f"  forward          {forward / length / 1e6:,.1f} MFLOP")
    print(f"  training         {training_flops(config, length, length) / length / 1e6:,.1f} MFLOP")


DEMO_RECIPE = dict(corpus="bible-en-es", max_tokens=4096, warmup_steps=1000, lr_scale=1.0, max_steps=1_000_000,
                   save_every=500, save_minutes=2.0, log_every=50, eval_every=500, eval_bleu_sentences=100)


def cmd_demo(args: argparse.Namespace) -> None:
    """The main job on the built-in default: train the `small` preset on bible-en-es for a time
    budget, translate the held-out test books and score them. Run again, it resumes the run in
    --out until the budget is spent, then only translates."""
    from aiayn.checkpoint import checkpoint_dirs
    from aiayn.data import load_corpus
    from aiayn.evaluate import bleu
    from aiayn.train import train_run
    from aiayn.translate import translate_texts

    run_dir = Path(args.out)
    recipe = TrainConfig(**DEMO_RECIPE, minutes=args.minutes, precision=args.precision, seed=args.seed)
    resume = bool(checkpoint_dirs(run_dir))
    if resume:
        model_config = ModelConfig.from_dict(json.loads((run_dir / "model_config.json").read_text(encoding="utf-8")))
    else:
        model_config = PRESETS[args.preset]
    trainer = train_run(model_config, recipe, run_dir, resume=resume)
    test = load_corpus(recipe.corpus).splits["test"][: args.test_sentences]
    print(f"translating {len(test):,} test verses (greedy decoding)...")
    start = time.perf_counter()
    hypotheses = translate_texts(trainer.model, trainer.tokenizer, [s for s, _ in test], precision=recipe.precision)
    seconds = time.perf_counter() - start
    score, signature = bleu(hypotheses, [t for _, t in test])
    print(f"test BLEU {score:.1f} ({signature}), {len(test) / seconds:.1f} sentences/s")
    for (source, reference), hypothesis in list(zip(test, hypotheses))[:: max(1, len(test) // 4)][:4]:
        print(f"\n  source     {source}\n  reference  {reference}\n  aiayn      {hypothesis}")


def _train_configs(args: argparse.Namespace, run_dir: Path) -> tuple[ModelConfig, TrainConfig]:
    """The configs of a new run (preset + overrides), or of the run being resumed."""
    model_overrides, train_overrides = given_fields(args, ModelConfig), given_fields(args, TrainConfig)
    saved = run_dir / "model_config.json"
    if args.resume and saved.exists():
        model_config = ModelConfig.from_dict(json.loads(saved.read_text(encoding="utf-8")))
        if dataclasses.replace(model_config, **model_overrides) != model_config:
            raise UserError(f"a resumed run keeps its model; {run_dir} was trained with {saved.name}, drop the model options")
        recipe = TrainConfig(**json.loads((run_dir / "train_config.json").read_text(encoding="utf-8")))
        return model_config, dataclasses.replace(recipe, **train_overrides)
    recipe = {**TRAIN_OVERRIDES.get(args.preset, {}), **train_overrides}
    return config_from_args(args), TrainConfig(**recipe)


def cmd_train(args: argparse.Namespace) -> None:
    """Train a model with the recipe of §5; see `aiayn train --help`."""
    from aiayn.train import check_run_dir, train_run

    run_dir = Path(args.out)
    check_run_dir(run_dir, args.resume)
    model_config, recipe = _train_configs(args, run_dir)
    train_run(model_config, recipe, run_dir, args.resume)


def cmd_average(args: argparse.Namespace) -> None:
    """§6.1: average the weights of the last N checkpoints of a run."""
    from aiayn.checkpoint import average_checkpoints, checkpoint_dirs

    found = checkpoint_dirs(args.run_dir)
    if not found:
        raise UserError(f"no checkpoints in {args.run_dir}")
    if args.last < 1:
        raise UserError("--last must be at least 1")
    chosen = found[-args.last :]
    if len(chosen) < args.last:
        print(f"note: {args.run_dir} keeps {len(found)} checkpoints; averaging those")
    average_checkpoints(chosen, args.out)
    print(f"averaged {', '.join(p.name for p in chosen)} into {args.out}")


def cmd_corpus_export(args: argparse.Namespace) -> None:
    """Write one split of a corpus as two plain-text files."""
    from aiayn.data import export_split, load_corpus

    for path in export_split(load_corpus(args.name), args.split, args.out):
        print(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description="The Transformer of 'Attention Is All You Need', as a tool."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="print a preset's configuration, parameters and FLOPs per token")
    add_config_arguments(info)
    info.add_argument("--length", type=int, default=32, help="sentence length for the FLOPs count (default 32)")
    info.set_defaults(run=cmd_info)

    train = sub.add_parser("train", help="train a translation model with the recipe of §5")
    add_config_arguments(train)
    train.add_argument("--out", required=True, help="the run folder: checkpoints, log.jsonl, loss.png, model/")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_dataclass_arguments(train, TrainConfig, "training options (§5)")
    train.set_defaults(run=cmd_train)

    average = sub.add_parser("average", help="average the last N checkpoints of a run (§6.1)")
    average.add_argument("run_dir", metavar="RUN_DIR")
    average.add_argument("--last", type=int, default=5, help="how many (5 for base, 20 for big; default 5)")
    average.add_argument("--out", required=True, help="the model folder to write")
    average.set_defaults(run=cmd_average)

    corpus = sub.add_parser("corpus", help="work with corpora")
    corpus_sub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    export = corpus_sub.add_parser("export", help="write a split as two plain-text files")
    export.add_argument("name", metavar="NAME", help="a built-in corpus name or a path")
    export.add_argument("--split", default="test", help="train, dev or test (default test)")
    export.add_argument("--out", required=True, help="folder for SPLIT.SRC and SPLIT.TGT")
    export.set_defaults(run=cmd_corpus_export)

    demo = sub.add_parser("demo", help="train on bible-en-es for a time budget, translate the test books, score")
    demo.add_argument("--minutes", type=float, default=10.0, help="training time budget (default 10)")
    demo.add_argument("--out", default="runs/demo", help="run folder (default runs/demo; reused if present)")
    demo.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model preset (default small)")
    demo.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--test-sentences", type=int, default=None, help="translate only the first N test verses")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (UserError, ValueError, ImportError, OSError) as error:  # OSError: files, network
        parser.exit(2, f"aiayn: error: {error}\n")
    except KeyboardInterrupt:
        parser.exit(130, "aiayn: interrupted\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
