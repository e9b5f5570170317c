"""The `aiayn` command line: argument parsing, and one call per command.

Every flag is a dataclass field: model options come from `ModelConfig` (`--d-model 256`), training
options from `TrainConfig`, decoding options from `DecodeConfig` (`--beam 4`, `--precision int8`)
and each command's own from its `...Options` class in aiayn.config, so the API, the CLI and the
saved configs share one definition. User mistakes end with a one-line `aiayn: error: ...` and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import signal
import sys
import threading
import typing
from pathlib import Path
from typing import Optional, Sequence

from aiayn.config import (DECODE_PRESETS, PAPER_PARAMS_M, PRESETS, TRAIN_OVERRIDES, AttentionOptions,
    ArgosOptions, AverageOptions, ConvertOptions, CorpusExportOptions, Ct2Options, DecodeConfig, DemoOptions, FileDecodeOptions, InfoOptions,
    ModelConfig, PreprocessOptions, ScoreOptions, ServeOptions, Table3Options, TrainConfig, TrainOptions, TranslateFileOptions, check_options, decode_field_problem, preset, recipe)
from aiayn import __version__
from aiayn.errors import ClosedStdout, Terminated, ask_for_less, command_line_message, environment_count, out_of_memory


class UserError(Exception):
    """A mistake in the user's input: reported in one line, exit status 2."""


def _parse_bool(text: str) -> bool:
    words = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("0", "false", "no", "off"), False)
    if (value := words.get(text.lower())) is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def _value_type(hint):
    """The argparse `type` of a field's type hint (Optional[int] -> int, list[str] -> str)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is list:
        return args[0]
    return _value_type(args[0]) if args else (_parse_bool if hint is bool else hint)


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """The flags (and positional arguments) of an options dataclass, defaults and help from its
    fields; `options(args, cls)` reads them back."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta, hint = f.metadata, hints[f.name]
        required = f.default is dataclasses.MISSING
        kwargs: dict = {"help": meta.get("help", "") + ("" if required or f.default in (None, False) else
                                                         f" (default {f.default})")}
        if hint is bool:
            kwargs["action"] = "store_true"
        else:
            choices = meta.get("choices")
            literal = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
            choices = choices() if choices else literal
            kwargs.update(type=None if literal else _value_type(hint), choices=choices, nargs=meta.get("nargs"),
                          metavar=meta.get("metavar") or (None if choices else f.name.upper()),
                          # `--rows base --rows A` is both rows (found by a misuse hunt: A alone)
                          action="extend" if meta.get("nargs") and not meta.get("positional") else "store")
        if meta.get("positional"):
            parser.add_argument(f"{cls.__name__}.{f.name}", **kwargs)
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f"{cls.__name__}.{f.name}", required=required,
                                default=None if required else f.default, **kwargs)


def options(args: argparse.Namespace, cls):
    """The options dataclass the flags of `add_options` give, its bounds checked."""
    built = cls(**{f.name: getattr(args, f"{cls.__name__}.{f.name}") for f in dataclasses.fields(cls)})
    check_options(built)
    return built


def add_overrides(parser: argparse.ArgumentParser, cls, title: str) -> None:
    """One `--field-name VALUE` option per field of `cls` (unset: the preset's; TrainConfig's own said)."""
    group = parser.add_argument_group(title, " ".join(cls.__doc__.split()) if (train := cls is TrainConfig) else None)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        shown = f" (default {str(f.default).lower() if isinstance(f.default, bool) else f.default})" if train and f.default is not None else ""
        kwargs: dict = {"dest": f"{cls.__name__}.{f.name}", "default": None, "metavar": f.name.upper(),
                        "help": f.metadata.get("help", "") + shown}
        if typing.get_origin(hints[f.name]) is typing.Literal:
            kwargs.update(choices=typing.get_args(hints[f.name]), metavar=None)
        else:
            kwargs["type"] = _value_type(hints[f.name])
        group.add_argument(f"--{f.name.replace('_', '-')}", **kwargs)


def given_fields(args: argparse.Namespace, cls) -> dict:
    """The fields of `cls` that the command line set."""
    values = {f.name: getattr(args, f"{cls.__name__}.{f.name}") for f in dataclasses.fields(cls)}
    return {name: value for name, value in values.items() if value is not None}


def add_decode_arguments(parser: argparse.ArgumentParser, preset_name: str, names: Sequence[str]) -> None:
    """`--beam`, `--alpha`, ...: the DecodeConfig fields `names`, defaults from
    `DECODE_PRESETS[preset_name]`; `decode_config(args)` reads them back."""
    decode = DECODE_PRESETS[preset_name]
    hints = typing.get_type_hints(DecodeConfig)
    for f in dataclasses.fields(DecodeConfig):
        if f.name not in names:
            continue
        default = getattr(decode, f.name)
        shown = "none" if default is None else str(default).lower() if isinstance(default, bool) else default  # as flags take it
        kwargs: dict = {"default": default, "help": f"{f.metadata['help']} (default {shown})"}
        if typing.get_origin(hints[f.name]) is typing.Literal:  # --precision, --stop
            kwargs["choices"] = typing.get_args(hints[f.name])
        else:
            kwargs["type"] = _value_type(hints[f.name])
        parser.add_argument(f"--{f.name.replace('_', '-')}", **kwargs)
    parser.set_defaults(decode_preset=preset_name, decode_fields=tuple(names))


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The DecodeConfig that the flags of `add_decode_arguments` give, checked flag by flag."""
    values = {name: getattr(args, name) for name in args.decode_fields}
    for name, value in values.items():
        problem = decode_field_problem(name, value)
        if problem:
            raise UserError(f"--{name.replace('_', '-')} {problem}")
    return dataclasses.replace(DECODE_PRESETS[args.decode_preset], **values)


def config_from_args(args: argparse.Namespace, preset_name: str) -> ModelConfig:
    return dataclasses.replace(preset(preset_name), **given_fields(args, ModelConfig))


# --------------------------------------------------------------------------------------------
# The commands: each reads its options and makes one call into the package.


def cmd_info(args: argparse.Namespace) -> None:
    """Print a preset's configuration, parameter count and FLOPs per token."""
    from aiayn.checkpoint import parameter_counts
    from aiayn.flops import forward_flops, training_flops
    from aiayn.model import Transformer

    info = options(args, InfoOptions)
    config = config_from_args(args, info.preset)
    counts = parameter_counts(Transformer, config)  # shapes only: even `big` costs no memory
    total = counts["total"]
    d_k, d_v = config.head_dims
    print(f"preset {info.preset}")
    for key, value in config.to_dict().items():
        print(f"  {key:18} {({'d_k': d_k, 'd_v': d_v}[key] if key in ('d_k', 'd_v') and value is None else value)}")
    for key, value in TRAIN_OVERRIDES.get(info.preset, {}).items():  # a Table 3 row that changes training
        print(f"  {key:18} {value} (training: `aiayn train --preset {info.preset}` sets it)")
    print(f"parameters         {total:,} ({total / 1e6:.1f}M)")
    for part in ("embeddings", "encoder", "decoder"):
        print(f"  {part:16} {counts[part]:,}")
    if info.preset in PAPER_PARAMS_M and config == PRESETS[info.preset]:
        print(f"  paper (Table 3)  {PAPER_PARAMS_M[info.preset]:.0f}M")
    length = info.length  # past max_len said (found in review: counted without a word)
    past = f"; past max_len, {config.max_len}, the longest the model takes" if length > config.max_len else ""
    print(f"FLOPs per target token (sentence pairs of {length} + {length} tokens{past})")
    print(f"  forward          {forward_flops(config, length, length) / length / 1e6:,.1f} MFLOP")
    print(f"  training         {training_flops(config, length, length) / length / 1e6:,.1f} MFLOP")


def cmd_train(args: argparse.Namespace) -> None:
    """Train a model with the recipe of §5; see `aiayn train --help`."""
    from aiayn.prepare import RunDir, run_configs
    from aiayn.train import train_run

    train = options(args, TrainOptions)
    chosen = recipe(train.recipe or "paper")
    given = given_fields(args, TrainConfig)
    preset_train = TRAIN_OVERRIDES.get(train.preset or "base", {})
    model_config, training = run_configs(  # its notes said by one of torchrun's processes (found by a misuse hunt)
        RunDir(train.out), train.resume, preset(train.preset or "base"), chosen.model,
        {**preset_train, **chosen.train_changes(preset_train, given, environment_count("WORLD_SIZE", 1))},
        given_fields(args, ModelConfig), given, given_preset=train.preset, given_recipe=train.recipe if train.resume else None,
        echo=print if environment_count("RANK", 0) == 0 else lambda _: None)
    train_run(model_config, training, Path(train.out), train.resume)


def cmd_preprocess(args: argparse.Namespace) -> None:
    """Encode a corpus once into a memory-mapped DATA_DIR for `aiayn train --data` (aiayn.store)."""
    from aiayn.store import preprocess_command

    preprocess_command(options(args, PreprocessOptions))


def cmd_average(args: argparse.Namespace) -> None:
    """§6.1: average the weights of the last N checkpoints of a run."""
    from aiayn.run import average_last

    average_last(options(args, AverageOptions))


def cmd_hf(args: argparse.Namespace) -> None:
    """import-hf: an HF Marian (OPUS-MT) folder -> an aiayn run; export-hf: the reverse (aiayn.marian)."""
    from aiayn.marian import export_marian, import_marian

    convert = options(args, ConvertOptions)
    (import_marian if args.command == "import-hf" else export_marian)(convert.source, convert.out, force=convert.force)


def cmd_ct2(args: argparse.Namespace) -> None:
    """export-ct2: an aiayn run or model folder -> a CTranslate2 model folder; export-argos: -> an
    Argos Translate package, which LibreTranslate installs: aiayn.ct2."""
    from aiayn.ct2 import export_argos, export_ct2

    if args.command == "export-argos":
        argos = options(args, ArgosOptions)
        export_argos(argos.source, argos.out, argos.source_lang, argos.target_lang, force=argos.force)
    else:
        ct2 = options(args, Ct2Options)
        export_ct2(ct2.source, ct2.out, ct2.quantization, force=ct2.force)


def cmd_corpus_export(args: argparse.Namespace) -> None:
    """Write one split of a corpus as two plain-text files."""
    from aiayn.corpora import export_split, stream_corpus
    from aiayn.run import run_files, stderr_note

    export = options(args, CorpusExportOptions)
    read = [export.name] if Path(export.name).exists() else []
    print(*export_split(stream_corpus(export.name, export.src_lang, export.tgt_lang), export.split, export.out,
                        export.force, read, stderr_note, kept=run_files(export.out)), sep="\n")


def cmd_translate(args: argparse.Namespace) -> None:
    """Translate one sentence a line (§6.1 settings by default); empty lines stay empty."""
    from aiayn.decode_files import translate_file

    translate_file(options(args, TranslateFileOptions), decode_config(args), "translate")


def cmd_parse(args: argparse.Namespace) -> None:
    """Parse one tokenized sentence a line into a bracketed tree (§6.3). Malformed model output
    is repaired into a valid tree over the input words (see aiayn.parsing.delinearize)."""
    from aiayn.parsing import delinearize, tree_to_string
    from aiayn.decode_files import translate_file

    translate_file(options(args, FileDecodeOptions), decode_config(args), "parse",
                   lambda line, output: tree_to_string(delinearize(output, line.split())))


def cmd_score(args: argparse.Namespace) -> None:
    """sacreBLEU's BLEU and chrF with their signatures, and the paper's tokenized, compound-split
    BLEU; or, with --parse, labelled bracket precision, recall and F1 (EVALB, COLLINS.prm)."""
    from aiayn.evaluate import score_files

    score_files(options(args, ScoreOptions))


def cmd_attention(args: argparse.Namespace) -> None:
    """Heatmaps of every layer's and head's attention for one sentence (Figures 3-5)."""
    from aiayn.decode_files import attention_command

    attention_command(options(args, AttentionOptions), decode_config(args))


def cmd_serve(args: argparse.Namespace) -> None:
    """Serve a model over HTTP (aiayn.serve): POST /translate decodes concurrent requests together; the page
    at / draws the attention. SIGTERM or Ctrl-C drains the queue, then exits (0 on SIGTERM)."""
    serve_options, decode = options(args, ServeOptions), decode_config(args)  # checked before FastAPI loads
    try:
        from aiayn.serve.server import serve
    except ImportError as error:
        raise UserError(f"aiayn serve needs FastAPI and uvicorn ({error}): pip install 'aiayn[serve]'") from None
    serve(serve_options, decode)


def cmd_experiment_table3(args: argparse.Namespace) -> None:
    """Table 3 in miniature (aiayn.experiment): train each row, score it, print the table."""
    from aiayn.experiment import run_table3
    from aiayn.table3 import TABLE_MD, TABLE_PNG

    table3 = options(args, Table3Options)
    run_table3(out := Path(table3.out), table3.scale, **{name: value for name, value in vars(table3).items() if name not in ("out", "scale")})
    print("\n" + (out / TABLE_MD).read_text(encoding="utf-8"))
    print(f"table {out / TABLE_MD}, " + (f"plot {out / TABLE_PNG}" if (out / TABLE_PNG).exists() else
                                         "no plot: it draws each row against the base row (add base to --rows)"))


def cmd_demo(args: argparse.Namespace) -> None:
    """Train on bible-en-es for a time budget, average, translate the test books, score (aiayn.demo)."""
    from aiayn.demo import run_demo

    run_demo(options(args, DemoOptions), decode_config(args))


# --------------------------------------------------------------------------------------------


COMMANDS = (  # name, run, what, options class, decoding flags (preset, fields)
    ("info", cmd_info, "print a preset's configuration, parameters and FLOPs per token", InfoOptions, None),
    ("train", cmd_train, "train a translation model with the recipe of §5", TrainOptions, None),
    ("preprocess", cmd_preprocess, "encode a corpus once into a memory-mapped folder for train --data",
     PreprocessOptions, None),
    ("average", cmd_average, "average the last N checkpoints of a run (§6.1)", AverageOptions, None),
    ("import-hf", cmd_hf, "convert a local HF Marian (OPUS-MT) folder into an aiayn run folder", ConvertOptions, None),
    ("export-hf", cmd_hf, "write a run as an HF MarianMTModel folder (for transformers)", ConvertOptions, None),
    ("export-ct2", cmd_ct2, "write a run as a CTranslate2 model folder (pre-norm or post-norm)", Ct2Options, None),
    ("export-argos", cmd_ct2, "write a run as an Argos Translate package (.argosmodel) for LibreTranslate",
     ArgosOptions, None),
    ("translate", cmd_translate, "translate a file or stdin, one sentence a line (§6.1 decoding)", TranslateFileOptions,
     ("translate", [f.name for f in dataclasses.fields(DecodeConfig)])),
    ("parse", cmd_parse, "parse tokenized sentences into trees (§6.3 decoding)", FileDecodeOptions,
     ("parse", [f.name for f in dataclasses.fields(DecodeConfig)])),
    ("score", cmd_score, "BLEU and chrF of hypotheses against references, or EVALB's F1 of trees", ScoreOptions, None),
    ("attention", cmd_attention, "attention heatmaps of one sentence (Figures 3-5)", AttentionOptions,
     ("translate", ["beam", "alpha"])),
    ("serve", cmd_serve, "serve a model over HTTP: POST /translate (continuous batching) and a page with the attention",
     ServeOptions, ("translate", ["precision", "stop"])),
    ("demo", cmd_demo, "train on bible-en-es for a time budget, translate the test books, score", DemoOptions,
     ("translate", ["beam", "alpha"])),
)


class _Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, as every other user error (not the usage block);
    no option stands for another it begins (fairseq's `--lr 5e-4` was taken for `--lr-scale 5e-4`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs, allow_abbrev=False)

    def error(self, message: str):
        self.exit(2, f"aiayn: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aiayn", description="The Transformer of 'Attention Is All You Need', as a tool.")
    parser.add_argument("--version", action="version", version=f"aiayn {__version__}, PyTorch {importlib.metadata.version('torch')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    classes = [cls for _, _, _, cls, _ in COMMANDS]
    for name, run, what, cls, decoding in COMMANDS:  # options two commands share (or extend) describe neither alone
        shared = sum(issubclass(cls, other) or issubclass(other, cls) for other in classes) > 1
        described = what[0].upper() + what[1:] if shared else cls.__doc__
        command = sub.add_parser(name, help=what, description=described)
        add_options(command, cls)
        if name in ("info", "train"):
            add_overrides(command, ModelConfig, "model options (override the preset)")
        if name == "train":
            add_overrides(command, TrainConfig, "training options (§5)")
        if decoding:
            add_decode_arguments(command, *decoding)
        command.set_defaults(run=run, parser=command)
    corpus = sub.add_parser("corpus", help="work with corpora")
    export = corpus.add_subparsers(dest="corpus_command", required=True, metavar="ACTION").add_parser(
        "export", help="write a split as two plain-text files")
    add_options(export, CorpusExportOptions)
    export.set_defaults(run=cmd_corpus_export, parser=export)
    experiment = sub.add_parser("experiment", help="rerun an experiment of the paper in miniature")
    table3 = experiment.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT").add_parser(
        "table3", help="train the base model and every variation of Table 3, print ours beside the paper's")
    add_options(table3, Table3Options)
    table3.set_defaults(run=cmd_experiment_table3, parser=table3)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser, words = build_parser(), list(sys.argv[1:] if argv is None else argv)
    if words[:1] and words[0].startswith("-") and words[0] not in ("-h", "--help", "--version"):  # `aiayn --beam 4 translate`
        parser.error(f"unrecognized arguments: {words[0]} before the command (its options follow it: aiayn COMMAND {words[0]} ...)")
    args, unknown = parser.parse_known_args(words)
    if unknown:  # after the command (above: before it): said by its parser, whose --help lists its options
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C, so that partial outputs are reported.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    sys.stdout = sys.stdout or ClosedStdout()
    try:
        args.run(args)  # PyTorch loads here, under the handlers: a Ctrl-C while it loads is one line too
        if (device := sys.modules.get("aiayn.device")) is not None:  # (none loaded: no torch, no group)
            device.leave_process_group()
    except BrokenPipeError:  # stdout's reader has gone (`aiayn translate ... | head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or Python's last flush fails again
        return 128 + signal.SIGPIPE  # as a process that SIGPIPE ended
    except (UserError, ValueError, FloatingPointError, ImportError, OSError) as error:  # OSError: files, network
        parser.exit(2, f"aiayn: error: {command_line_message(error)}\n")
    except KeyboardInterrupt as stop:  # 128 + the signal, as a process that the signal ended
        parser.exit(128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT), "aiayn: interrupted\n")
    except (MemoryError, RuntimeError) as error:
        if not out_of_memory(error):
            raise
        ask = ask_for_less(args.command)
        parser.exit(2, f"aiayn: error: out of memory ({type(error).__name__}); {ask}\n")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum: int, frame) -> None:
    raise Terminated


if __name__ == "__main__":
    sys.exit(main())
