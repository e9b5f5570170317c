"""The `aiayn` command line: one program, one subcommand per job.

Model options are derived from the `ModelConfig` dataclass fields (`--d-model 256`,
`--positional learned`, ...), so the API, the CLI and the saved config share one definition.
User mistakes end with a one-line `aiayn: error: ...` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from typing import Optional, Sequence

import torch

from aiayn.config import PAPER_PARAMS_M, PRESETS, ModelConfig, preset
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


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--preset NAME` plus one `--field-name VALUE` option per ModelConfig field."""
    parser.add_argument("--preset", default="base", help=f"model preset: {', '.join(PRESETS)} (default: base)")
    group = parser.add_argument_group("model options (override the preset)")
    hints = typing.get_type_hints(ModelConfig)
    for f in dataclasses.fields(ModelConfig):
        hint = hints[f.name]
        kwargs: dict = {"dest": f"config_{f.name}", "default": None, "metavar": f.name.upper()}
        args = typing.get_args(hint)
        if typing.get_origin(hint) is typing.Literal:
            kwargs.update(choices=args, metavar=None)
        elif hint is bool:
            kwargs["type"] = _parse_bool
        else:
            kwargs["type"] = next((a for a in args if a is not type(None)), hint)
        group.add_argument(f"--{f.name.replace('_', '-')}", **kwargs)


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    overrides = {
        f.name: getattr(args, f"config_{f.name}")
        for f in dataclasses.fields(ModelConfig)
        if getattr(args, f"config_{f.name}") is not None
    }
    return dataclasses.replace(preset(args.preset), **overrides)


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


def cmd_demo(args: argparse.Namespace) -> None:
    """The main job on the built-in default. For now: build the `tiny` model, run a forward pass
    and print its summary; training, translation and scoring join as they land."""
    from aiayn.model import Transformer

    torch.manual_seed(args.seed)
    config = PRESETS["tiny"]
    model = Transformer(config).eval()
    print(f"aiayn demo: the `tiny` Transformer, {model.num_parameters():,} parameters")
    print(model)
    batch, src_len, tgt_len = 8, 20, 16
    src = torch.randint(4, config.vocab_size, (batch, src_len))
    tgt = torch.randint(4, config.vocab_size, (batch, tgt_len))
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(src, tgt)
    elapsed = time.perf_counter() - start
    print(f"forward pass: src {tuple(src.shape)} + tgt {tuple(tgt.shape)} -> logits {tuple(logits.shape)} "
          f"in {elapsed * 1e3:.1f} ms")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn", description="The Transformer of 'Attention Is All You Need', as a tool."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="print a preset's configuration, parameters and FLOPs per token")
    add_config_arguments(info)
    info.add_argument("--length", type=int, default=32, help="sentence length for the FLOPs count (default 32)")
    info.set_defaults(run=cmd_info)

    demo = sub.add_parser("demo", help="run the main job on the built-in default")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (UserError, ValueError, FileNotFoundError) as error:
        parser.exit(2, f"aiayn: error: {error}\n")
    except KeyboardInterrupt:
        parser.exit(130, "aiayn: interrupted\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
