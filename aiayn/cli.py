"""The `aiayn` command line: one program, one subcommand per job.

Model options are derived from the `ModelConfig` dataclass fields (`--d-model 256`,
`--positional learned`, ...), and decoding options from `DecodeConfig`'s (`--beam 4`,
`--precision int8`), so the API, the CLI and the saved config share one definition.
User mistakes end with a one-line `aiayn: error: ...` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import time
import typing
from pathlib import Path
from typing import Optional, Sequence

import torch

from aiayn.config import (
    DECODE_PRECISIONS,
    DECODE_PRESETS,
    DEMO_AVERAGE_LAST,
    DEMO_RECIPE_NAME,
    PAPER_PARAMS_M,
    PRECISIONS,
    PRESETS,
    RECIPES,
    TRAIN_OVERRIDES,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    decode_field_problem,
    demo_model,
    demo_training,
    preset,
    recipe,
)
from aiayn.device import cpu_kind, matmul_peak_flops
from aiayn.flops import forward_flops, training_flops
from aiayn.store import SAMPLE_SENTENCES


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


def add_decode_arguments(parser: argparse.ArgumentParser, preset_name: str, names: Sequence[str]) -> None:
    """`--beam`, `--alpha`, ...: the DecodeConfig fields `names`, defaults from
    `DECODE_PRESETS[preset_name]`; `decode_config(args)` reads them back."""
    decode = DECODE_PRESETS[preset_name]
    hints = typing.get_type_hints(DecodeConfig)
    for f in dataclasses.fields(DecodeConfig):
        if f.name not in names:
            continue
        default = getattr(decode, f.name)
        shown = "none" if default is None else default
        kwargs: dict = {"default": default, "help": f"{f.metadata['help']} (default {shown})"}
        if f.name == "precision":
            kwargs["choices"] = DECODE_PRECISIONS
        else:
            kwargs["type"] = next(a for a in (*typing.get_args(hints[f.name]), hints[f.name]) if a in (int, float))
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


AVERAGED = "averaged"  # the demo's averaged model, in its run folder


def cmd_demo(args: argparse.Namespace) -> None:
    """The main job on the built-in default: train the `small` preset on bible-en-es for a time
    budget, average the last checkpoints and translate the held-out test books with beam search
    (§6.1), score them and draw the attention of one verse. Run again, it resumes the run in
    --out until the budget is spent, then only averages and translates."""
    from aiayn.checkpoint import run_lock

    run_dir = Path(args.out)
    with run_lock(run_dir):  # held from the training to the last attention map
        _demo(args, run_dir)


def _demo(args: argparse.Namespace, run_dir: Path) -> None:
    from aiayn.evaluate import bleu, paper_bleu
    from aiayn.train import MODEL_CONFIG, load_run_configs, train_run
    from aiayn.translate import translate_ids
    from aiayn.visualize import attention_figures

    resume = (run_dir / MODEL_CONFIG).is_file()
    if resume:  # the run goes on as it began: its model and recipe, a new budget
        model_config, training = load_run_configs(run_dir)
        training = dataclasses.replace(training, minutes=args.minutes)
    else:
        model_config = demo_model(args.preset, args.recipe)
        training = demo_training(args.recipe, minutes=args.minutes, precision=args.precision, seed=args.seed)
        print(f"recipe {args.recipe}: {recipe(args.recipe).about}")
    trainer, store = train_run(model_config, training, run_dir, resume=resume)
    model, tokenizer = trainer.model.eval(), trainer.tokenizer
    if DEMO_AVERAGE_LAST:  # §6.1: the mean of the last checkpoints translates
        from aiayn.checkpoint import average_checkpoints, checkpoint_dirs

        chosen = checkpoint_dirs(run_dir)[-DEMO_AVERAGE_LAST:]
        average_checkpoints(chosen, run_dir / AVERAGED, force=True)  # made anew from this run's checkpoints
        model = type(model).load(run_dir / AVERAGED).eval()
        print(f"averaged the last {len(chosen)} checkpoints ({chosen[0].name} ... {chosen[-1].name}) into "
              f"{run_dir / AVERAGED}")
    test = store.texts("test")[: args.test_sentences]
    decode = dataclasses.replace(decode_config(args), precision=training.precision)
    print(f"translating {len(test):,} test verses (beam {decode.beam}, α {decode.alpha}, "
          f"max length = source + {decode.extra_len})...")
    start = time.perf_counter()
    outputs = translate_ids(model, tokenizer.encode_batch([s for s, _ in test]), decode)
    seconds = time.perf_counter() - start
    hypotheses = [tokenizer.decode(ids) for ids in outputs]
    references = [t for _, t in test]
    score, signature = bleu(hypotheses, references)
    print(f"test BLEU {score:.1f} ({signature}); paper protocol {paper_bleu(hypotheses, references, 'es'):.1f}; "
          f"{len(test) / seconds:.1f} sentences/s")
    # What the figure depends on: the steps the budget bought on this machine (the peak was
    # measured by the training itself, and is cached).
    peak = matmul_peak_flops(trainer.device, training.precision)
    print(f"machine: {cpu_kind()}, {torch.get_num_threads()} threads, {training.precision} matmul peak "
          f"{peak / 1e12:.2f} TFLOP/s; {trainer.step:,} steps")
    samples = list(range(0, len(test), max(1, len(test) // 4)))[:4]
    for i in samples:
        print(f"\n  source     {test[i][0]}\n  reference  {test[i][1]}\n  aiayn      {hypotheses[i]}")
    shortest = min(samples, key=lambda i: len(outputs[i]))
    paths = attention_figures(model, tokenizer, test[shortest][0], outputs[shortest], run_dir / "attention", force=True)
    print(f"\nattention maps of test verse {shortest + 1}: {paths[-1].parent}/ ({len(paths)} files)")


def cmd_experiment_table3(args: argparse.Namespace) -> None:
    """Table 3 in miniature (aiayn.experiment): train each row, score it, print the table."""
    from aiayn.experiment import TABLE_MD, TABLE_PNG, run_table3

    out = Path(args.out)
    run_table3(out, args.scale, args.rows, args.steps, args.precision, args.seed, args.corpus)
    print("\n" + (out / TABLE_MD).read_text(encoding="utf-8"))
    print(f"table {out / TABLE_MD}, plot {out / TABLE_PNG}")


def _train_configs(args: argparse.Namespace, run_dir: Path) -> tuple[ModelConfig, TrainConfig]:
    """The configs of a new run (preset + overrides), or of the run being resumed."""
    from aiayn.train import MODEL_CONFIG, load_run_configs

    model_overrides, train_overrides = given_fields(args, ModelConfig), given_fields(args, TrainConfig)
    if "data" in train_overrides:
        from aiayn.store import load_store

        if "corpus" in train_overrides:
            raise UserError("give --corpus or --data, not both")
        manifest = load_store(train_overrides["data"]).manifest
        train_overrides["corpus"] = manifest["corpus"]  # recorded in train_config.json: what the run learnt from
    if args.resume and (run_dir / MODEL_CONFIG).exists():  # the run's configs hold its recipe
        model_config, training = load_run_configs(run_dir)
        if training.data and "corpus" in train_overrides and "data" not in train_overrides:
            raise UserError(f"this run reads --data {training.data}; drop --corpus, or give another --data")
        if dataclasses.replace(model_config, **model_overrides) != model_config:
            raise UserError(f"a resumed run keeps its model; drop the model options (see {run_dir / MODEL_CONFIG})")
        return model_config, dataclasses.replace(training, **train_overrides)
    chosen = recipe(args.recipe)  # a new run: the recipe's changes under the options given explicitly
    model_overrides = {**chosen.model, **model_overrides}
    training = {**TRAIN_OVERRIDES.get(args.preset, {}), **chosen.train, **train_overrides}
    if train_overrides.get("init_from"):  # fine-tuning: the model is the one being started from
        from aiayn.checkpoint import read_config, resolve_model_dir

        _, model_config = read_config(resolve_model_dir(train_overrides["init_from"]))
        return dataclasses.replace(model_config, **given_fields(args, ModelConfig)), TrainConfig(**training)
    if "data" in train_overrides and "vocab_size" not in model_overrides:
        model_overrides["vocab_size"] = manifest["vocab_size"]  # a new model takes the data's vocabulary
    return dataclasses.replace(preset(args.preset), **model_overrides), TrainConfig(**training)


def cmd_train(args: argparse.Namespace) -> None:
    """Train a model with the recipe of §5; see `aiayn train --help`."""
    from aiayn.train import train_run

    run_dir = Path(args.out)
    model_config, recipe = _train_configs(args, run_dir)
    train_run(model_config, recipe, run_dir, args.resume)


def cmd_preprocess(args: argparse.Namespace) -> None:
    """Encode a corpus once into a memory-mapped DATA_DIR for `aiayn train --data` (aiayn.store)."""
    from aiayn.checkpoint import refuse_to_replace
    from aiayn.data import stream_corpus
    from aiayn.store import preprocess

    if args.verify is not None:
        from aiayn.store import load_store

        store = load_store(args.verify, verify=True)
        files = store.manifest.get("digests")
        if not files:
            raise UserError(f"{args.verify} was written before aiayn recorded digests; nothing to verify it against")
        size = sum((Path(args.verify) / name).stat().st_size for name in files)
        print(f"{args.verify}: all {len(files)} files match their SHA-256 ({size / 2**20:,.1f} MiB read)")
        return
    if args.corpus is None or args.out is None:
        raise UserError("give --corpus and --out (or --verify DATA_DIR)")
    if args.vocab_size is not None and args.tokenizer is not None:
        raise UserError("--tokenizer fixes the vocabulary; drop --vocab-size")
    for name in ("workers", "sample_sentences", "max_sentence_tokens", "vocab_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    read = [spec for spec in (args.corpus, args.tokenizer) if spec is not None and Path(spec).exists()]
    refuse_to_replace(args.out, args.force, inputs=read)
    vocab_size = args.vocab_size or PRESETS["base"].vocab_size
    if args.tokenizer is not None:
        from aiayn.tokenizer import has_tokenizer, load_tokenizer

        if not has_tokenizer(args.tokenizer):
            raise UserError(f"{args.tokenizer} holds no tokenizer (tokenizer.model, or Marian's three files)")
        vocab_size = load_tokenizer(args.tokenizer).vocab_size
    corpus = stream_corpus(args.corpus, args.src_lang, args.tgt_lang)
    preprocess(corpus, args.out, vocab_size, spec=args.corpus, tokenizer_from=args.tokenizer,
               max_sentence_tokens=args.max_sentence_tokens or TrainConfig.max_sentence_tokens,
               sample_sentences=args.sample_sentences or SAMPLE_SENTENCES, workers=args.workers or -1, force=args.force)


def cmd_average(args: argparse.Namespace) -> None:
    """§6.1: average the weights of the last N checkpoints of a run."""
    from aiayn.checkpoint import average_checkpoints, checkpoint_dirs, output_lock, refuse_to_replace

    found = checkpoint_dirs(args.run_dir)
    if not found:
        raise UserError(f"no checkpoints in {args.run_dir}")
    if args.last < 1:
        raise UserError("--last must be at least 1")
    chosen = found[-args.last :]
    refuse_to_replace(args.out, args.force, inputs=chosen)
    if len(chosen) < args.last:
        print(f"note: {args.run_dir} keeps {len(found)} checkpoints; averaging those")
    with output_lock(args.out):
        average_checkpoints(chosen, args.out, force=args.force)
    print(f"averaged {', '.join(p.name for p in chosen)} into {args.out}")


def cmd_import_hf(args: argparse.Namespace) -> None:
    """An HF Marian (OPUS-MT) folder -> an aiayn run folder."""
    from aiayn.marian import import_marian

    import_marian(args.hf_dir, args.out, force=args.force)


def cmd_export_hf(args: argparse.Namespace) -> None:
    """An aiayn run or model folder -> an HF Marian folder (loadable by transformers and CTranslate2)."""
    from aiayn.marian import export_marian

    export_marian(args.run_dir, args.out, force=args.force)


def cmd_corpus_export(args: argparse.Namespace) -> None:
    """Write one split of a corpus as two plain-text files."""
    from aiayn.data import export_split, load_corpus

    read = [args.name] if Path(args.name).exists() else []
    for path in export_split(load_corpus(args.name, args.src_lang, args.tgt_lang), args.split, args.out, args.force, read):
        print(path)


def _load_for_inference(path: str, device_name: str):
    """(model, tokenizer, device) from a model folder or a run folder."""
    from aiayn.checkpoint import resolve_model_dir
    from aiayn.device import resolve_device
    from aiayn.model import Transformer
    from aiayn.tokenizer import has_tokenizer, load_tokenizer

    model_dir = resolve_model_dir(path)
    device = resolve_device(device_name)
    model = Transformer.load(model_dir, device).eval()
    tokenizer = load_tokenizer(model_dir if has_tokenizer(model_dir) else Path(path))
    if tokenizer.vocab_size != model.config.vocab_size:
        raise UserError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {model.config.vocab_size}")
    return model, tokenizer, device


def _file_digest(path: str) -> str:
    """The SHA-256 of --input (a missing file: the one-line error of --input)."""
    from aiayn.store import file_sha256

    try:
        return file_sha256(path)
    except FileNotFoundError:
        raise UserError(f"no such file: {path}") from None


def _open_input(path: Optional[str]):
    """(binary handle, name for messages) of --input, or of stdin for none or "-"."""
    if path is None or path == "-":
        return sys.stdin.buffer, "stdin"
    try:
        return open(path, "rb"), path
    except FileNotFoundError:
        raise UserError(f"no such file: {path}") from None


def _read_lines(path: Optional[str]) -> list[str]:
    """Every line of a small file (or stdin), split as `wc -l` counts."""
    from aiayn.data import iter_lines

    handle, name = _open_input(path)
    with handle:
        return list(iter_lines(handle, name))


def _complete_lines(partial: Path) -> int:
    """The number of whole lines in an interrupted output; a line cut short is removed."""
    data = partial.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(partial, "r+b") as handle:
            handle.truncate(end)
    return data.count(b"\n", 0, end)


def _count_lines(handle) -> int:
    """Lines in a binary file as `iter_lines` splits them (a last line without "\\n" counts),
    the handle rewound."""
    count, last = 0, b"\n"
    for block in iter(lambda: handle.read(1 << 20), b""):
        count, last = count + block.count(b"\n"), block[-1:]
    handle.seek(0)
    return count + (last != b"\n")


def _decode_command(args: argparse.Namespace, finish=lambda line, output: output) -> None:
    """translate and parse: stream the input through the model in chunks. With --output, the
    lines go to OUTPUT.partial as each chunk is done, renamed to OUTPUT when all are; an
    interrupted run leaves OUTPUT.partial, which --resume continues."""
    from tqdm.auto import tqdm

    from aiayn.checkpoint import read_json, refuse_to_replace, write_json
    from aiayn.data import iter_lines
    from aiayn.translate import CHUNK_LINES, decoding_model, translate_stream

    decode = decode_config(args)
    if args.max_input_tokens < 1:
        raise UserError(f"--max-input-tokens must be at least 1, got {args.max_input_tokens}")
    out, skip = None, 0
    if args.output:
        final = Path(args.output)
        partial = final.with_name(final.name + ".partial")
        record = final.with_name(final.name + ".partial.json")  # which input the partial lines translate
        digest = None if args.input in (None, "-") else _file_digest(args.input)
        if args.resume and partial.exists():
            kept = read_json(record) if record.exists() else {}
            if digest is not None and kept.get("input_sha256") not in (None, digest):
                raise UserError(f"{partial} translates another input than {args.input} (its digest differs); "
                                "--resume needs the same input, --force starts over")
            skip = _complete_lines(partial)
        elif args.resume and final.exists():
            raise UserError(f"{final} is complete: nothing to resume (--force translates again)")
        elif not args.force and partial.exists():
            raise UserError(f"{partial} holds an interrupted translation; pass --resume to continue it "
                            "or --force to start over")
        refuse_to_replace(final, args.force or args.resume, inputs=[] if args.input in (None, "-") else [args.input])
        out = open(partial, "ab" if skip else "wb")  # an unwritable --output fails here, before decoding
        if not skip:
            write_json(record, {"input": args.input or "-", "input_sha256": digest})
    written = skip

    def write(lines: list[str]) -> None:
        nonlocal written
        text = "".join(line + "\n" for line in lines)
        if out is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            out.write(text.encode("utf-8"))
            out.flush()
        written += len(lines)

    try:
        model, tokenizer, _ = _load_for_inference(args.run_dir, args.device)
        model = decoding_model(model, decode.precision)  # cast or quantized once; the fp32 weights are let go
        source, name = _open_input(args.input)
        total = None
        if source is not sys.stdin.buffer:
            total = _count_lines(source) - skip
            if total < 0:
                raise UserError(f"{partial} holds {skip} lines but {name} has {total + skip}: "
                                "--resume needs the same input")
        interactive = source is sys.stdin.buffer and sys.stdin.isatty()
        note = lambda text: print(f"aiayn: note: {text}", file=sys.stderr)  # noqa: E731
        with source, tqdm(total=total, desc=args.command, unit="line", disable=not sys.stderr.isatty()) as bar:
            translate_stream(
                model, tokenizer, iter_lines(source, name, skip), write, max_input_tokens=args.max_input_tokens,
                finish=finish, chunk_lines=1 if interactive else CHUNK_LINES,
                note=note, first_line=skip + 1, progress=bar, decode=decode,
            )
    except BaseException as error:
        if out is not None:
            out.close()
            if not written:
                partial.unlink(missing_ok=True)
                record.unlink(missing_ok=True)
            elif written > skip or isinstance(error, KeyboardInterrupt):
                print(f"aiayn: note: {written} finished lines are in {partial}; rerun with --resume to continue",
                      file=sys.stderr)
        raise
    if out is not None:
        os.fsync(out.fileno())
        out.close()
        os.replace(partial, final)
        record.unlink(missing_ok=True)


def cmd_translate(args: argparse.Namespace) -> None:
    """Translate one sentence a line (§6.1 settings by default); empty lines stay empty."""
    _decode_command(args)


def cmd_parse(args: argparse.Namespace) -> None:
    """Parse one tokenized sentence a line into a bracketed tree (§6.3). Malformed model output
    is repaired into a valid tree over the input words (see aiayn.parsing.delinearize)."""
    from aiayn.parsing import delinearize, tree_to_string

    _decode_command(args, lambda line, output: tree_to_string(delinearize(output, line.split())))


def cmd_score(args: argparse.Namespace) -> None:
    """sacreBLEU with its signature, and the paper's tokenized, compound-split BLEU; or, with
    --parse, labelled bracket precision, recall and F1 (EVALB, COLLINS.prm conventions)."""
    from aiayn.evaluate import bleu, check_moses_language, paper_bleu

    if args.parse:
        from aiayn.parsing import evalb, read_trees

        if args.hyp is None:
            raise UserError("--parse needs --hyp (a file of bracketed trees)")
        gold, test = (read_trees("\n".join(_read_lines(path))) for path in (args.ref, args.hyp))
        if len(gold) != len(test):
            raise UserError(f"{len(test)} test trees but {len(gold)} gold trees")
        if not gold:
            raise UserError(f"{args.ref} holds no trees: nothing to score")
        result = evalb(gold, test)
        print(f"bracketing precision {result['precision']:.2f}  recall {result['recall']:.2f}  "
              f"F1 {result['f1']:.2f}  complete match {result['complete_match']:.2f}  "
              f"({len(gold)} sentences; EVALB with COLLINS.prm conventions)")
        return
    try:  # before reading and scoring, not after
        check_moses_language(args.lang)
    except ValueError as error:
        raise UserError(f"--lang {args.lang}: {error}") from None
    references = _read_lines(args.ref)
    hypotheses = _read_lines(args.hyp)
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypothesis lines but {len(references)} reference lines")
    if not references:
        raise UserError(f"{args.ref} is empty: no sentences to score")
    score, signature = bleu(hypotheses, references)
    print(f"sacreBLEU       {score:.2f}  {signature}")
    print(f"paper protocol  {paper_bleu(hypotheses, references, args.lang):.2f}  "
          f"(Moses tokenizer -l {args.lang}, compounds split, multi-bleu: as Table 2; not comparable with sacreBLEU)")


def cmd_attention(args: argparse.Namespace) -> None:
    """Heatmaps of every layer's and head's attention for one sentence (Figures 3-5)."""
    from aiayn.checkpoint import refuse_to_replace, resolve_model_dir
    from aiayn.translate import translate_ids
    from aiayn.visualize import attention_figures

    model, tokenizer, _ = _load_for_inference(args.run_dir, args.device)
    refuse_to_replace(args.out, args.force, inputs=[resolve_model_dir(args.run_dir)])
    if not args.sentence.strip():
        raise UserError("--sentence is empty")
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    source = args.sentence.strip()
    ids = tokenizer.encode(source)

    def check_length(tokens: int, side: str) -> None:
        # A map has a row per query and a column per key: the figures grow with the square of the
        # length (400 tokens took 385 s and 5.6 GB), and past a hundred or so are unreadable.
        if tokens > args.max_tokens:
            raise UserError(f"the {side} has {tokens} tokens, over --max-tokens {args.max_tokens}: each map is "
                            f"{tokens} × {tokens} cells; give a shorter sentence or raise --max-tokens")

    check_length(len(ids), "sentence")
    target = translate_ids(model, [ids], decode_config(args))[0]
    check_length(len(target), "translation")
    print(f"source       {source}\ntranslation  {tokenizer.decode(target)}")
    for path in attention_figures(model, tokenizer, source, target, Path(args.out), force=args.force):
        print(path)


def cmd_serve(args: argparse.Namespace) -> None:
    """Serve a model over HTTP (aiayn.serve): POST /translate batches concurrent requests; the page
    at / draws the attention. SIGTERM or Ctrl-C stops taking requests, decodes the queue for
    --drain-seconds, answers what is left 503, then exits (0 on SIGTERM)."""
    import asyncio
    import ipaddress
    import socket

    try:
        import uvicorn

        from aiayn.serve import MAX_WAIT_MS_LIMIT
        from aiayn.serve.app import LOOPBACK_NAMES, create_app
        from aiayn.serve.connections import guarded_protocol
    except ImportError as error:
        raise UserError(f"aiayn serve needs FastAPI and uvicorn ({error}): pip install 'aiayn[serve]'") from None
    decode = decode_config(args)
    if not 0 <= args.max_wait_ms <= MAX_WAIT_MS_LIMIT:  # nan and inf fail too
        raise UserError(f"--max-wait-ms must be between 0 and {MAX_WAIT_MS_LIMIT:g}, got {args.max_wait_ms}")
    for name, least in (("max_queue", 1), ("max_texts", 1), ("max_input_tokens", 1), ("max_connections", 1)):
        if getattr(args, name) < least:
            raise UserError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(args, name)}")
    for name, most in (("max_batch_mib", 1 << 20), ("max_attention_mib", 1 << 20), ("read_timeout", 3600),
                       ("drain_seconds", 3600)):
        if not 0 < getattr(args, name) <= most:  # nan and inf fail too
            raise UserError(f"--{name.replace('_', '-')} must be above 0 and at most {most:,}, got {getattr(args, name)}")
    listener = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # before the model loads: a port in use is a one-line error, not a log after seconds of loading
        listener.bind((args.host, args.port))
    except (OSError, OverflowError) as error:
        listener.close()
        raise UserError(f"cannot listen on {args.host}:{args.port}: {getattr(error, 'strerror', None) or error}") from None
    model, tokenizer, device = _load_for_inference(args.run_dir, args.device)
    # On a loopback address only loopback names are answered (no DNS rebinding); a server on
    # another address is meant to be reached by names this process cannot know.
    address = listener.getsockname()[0]
    allowed = (LOOPBACK_NAMES | {address if ":" not in address else f"[{address}]"}
               if ipaddress.ip_address(address).is_loopback else None)
    # The decoding copy create_app makes refuses a precision the device cannot run, in one line.
    app = create_app(model, tokenizer, precision=decode.precision, source=str(args.run_dir),
                     max_wait_ms=args.max_wait_ms, batch_tokens=decode.batch_tokens, max_queue=args.max_queue,
                     max_texts=args.max_texts, max_input_tokens=args.max_input_tokens, allowed_hosts=allowed,
                     max_batch_mib=args.max_batch_mib, max_attention_mib=args.max_attention_mib)
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {args.run_dir} ({model.num_parameters():,} parameters, {decode.precision} on {device}) at "
          f"http://{shown}:{port}/  (API: POST /translate, GET /health, /info, /openapi.json)", flush=True)
    # The batcher answers what is still queued at the drain deadline; uvicorn's own deadline, a
    # little later, only ever cancels the one batch being decoded then.
    config = uvicorn.Config(app, log_level="info" if args.access_log else "warning", access_log=args.access_log,
                            http=guarded_protocol(args.read_timeout, args.max_connections),
                            timeout_graceful_shutdown=args.drain_seconds + 10)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # A signal handler: it only schedules the drain, on the event loop, which takes locks.
            if not self.should_exit and self.started:
                loop.call_soon_threadsafe(app.state.drain, args.drain_seconds)
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None) -> None:
            nonlocal loop
            loop = asyncio.get_running_loop()
            await super().startup(sockets)

    loop = None
    server = Server(config)
    # uvicorn catches SIGTERM, drains, then raises the signal again for the handler it found:
    # a no-op here, so that a requested stop exits 0 rather than as an interruption.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run(sockets=[listener])
    stats = app.state.batcher.stats
    print(f"stopped: {stats.requests:,} requests, {stats.texts:,} texts in {stats.batches:,} batches", flush=True)


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
    train.add_argument("--recipe", default="paper", choices=sorted(RECIPES),
                       help="paper: §3.1 and §5 as written; fast: pre-norm, learns more per step (a deviation; "
                            "see the README) (default paper)")
    add_dataclass_arguments(train, TrainConfig, "training options (§5)")
    train.set_defaults(run=cmd_train)

    pre = sub.add_parser("preprocess", help="encode a corpus once into a memory-mapped folder for train --data")
    pre.add_argument("--corpus", help="a built-in name, a folder, a .tsv or .parquet file (as train --corpus)")
    pre.add_argument("--out", help="the DATA_DIR to write")
    pre.add_argument("--verify", metavar="DATA_DIR",
                     help="instead: check every byte of DATA_DIR against the SHA-256 its manifest records")
    pre.add_argument("--src-lang", help="source language (a folder's file suffix, a Parquet translation key)")
    pre.add_argument("--tgt-lang", help="target language")
    pre.add_argument("--vocab-size", type=int, help=f"shared BPE vocabulary (default {PRESETS['base'].vocab_size:,}, §5.1)")
    pre.add_argument("--tokenizer", help="use this model or run folder's tokenizer instead of training one (fine-tuning)")
    pre.add_argument("--sample-sentences", type=int,
                     help=f"sentences the tokenizer learns from, drawn at random (default {SAMPLE_SENTENCES:,})")
    pre.add_argument("--max-sentence-tokens", type=int,
                     help=f"leave out training pairs longer than this (default {TrainConfig.max_sentence_tokens})")
    pre.add_argument("--workers", type=int, help="encoding threads (default: every core)")
    pre.add_argument("--force", action="store_true", help="replace an existing --out, whole")
    pre.set_defaults(run=cmd_preprocess)

    average = sub.add_parser("average", help="average the last N checkpoints of a run (§6.1)")
    average.add_argument("run_dir", metavar="RUN_DIR")
    average.add_argument("--last", type=int, default=5, help="how many (5 for base, 20 for big; default 5)")
    average.add_argument("--out", required=True, help="the model folder to write")
    average.add_argument("--force", action="store_true", help="replace an existing --out")
    average.set_defaults(run=cmd_average)

    import_hf = sub.add_parser("import-hf", help="convert a local HF Marian (OPUS-MT) folder into an aiayn run folder")
    import_hf.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json, weights, source.spm, target.spm, vocab.json")
    import_hf.add_argument("out", metavar="OUT", help="the run folder to write (its model/ holds weights and tokenizer)")
    import_hf.add_argument("--force", action="store_true", help="replace an existing OUT, whole")
    import_hf.set_defaults(run=cmd_import_hf)

    export_hf = sub.add_parser("export-hf", help="write a run as an HF MarianMTModel folder (for transformers, CTranslate2)")
    export_hf.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, a checkpoint or a model folder")
    export_hf.add_argument("out", metavar="OUT", help="the HF folder to write")
    export_hf.add_argument("--force", action="store_true", help="replace an existing OUT, whole")
    export_hf.set_defaults(run=cmd_export_hf)

    corpus = sub.add_parser("corpus", help="work with corpora")
    corpus_sub = corpus.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    export = corpus_sub.add_parser("export", help="write a split as two plain-text files")
    export.add_argument("name", metavar="NAME", help="a built-in corpus name or a path")
    export.add_argument("--split", default="test", help="train, dev or test (default test)")
    export.add_argument("--out", required=True, help="folder for SPLIT.SRC and SPLIT.TGT")
    export.add_argument("--src-lang", help="source suffix, for a folder of aligned files")
    export.add_argument("--tgt-lang", help="target suffix, for a folder of aligned files")
    export.add_argument("--force", action="store_true", help="replace existing files")
    export.set_defaults(run=cmd_corpus_export)

    every_field = [f.name for f in dataclasses.fields(DecodeConfig)]
    for name, run, what in (
        ("translate", cmd_translate, "translate a file or stdin, one sentence a line (§6.1 decoding)"),
        ("parse", cmd_parse, "parse tokenized sentences into trees (§6.3 decoding)"),
    ):
        decode = sub.add_parser(name, help=what)
        decode.add_argument("run_dir", metavar="RUN_DIR", help="a run folder, a checkpoint or an averaged model folder")
        decode.add_argument("--input", help="input file (default: stdin)")
        decode.add_argument("--output", help="output file (default: stdout)")
        add_decode_arguments(decode, name, every_field)
        decode.add_argument("--max-input-tokens", type=int, default=1024, help="longer lines are cut (default 1024)")
        decode.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
        decode.add_argument("--resume", action="store_true",
                            help="continue OUTPUT.partial, left by an interrupted run, with the same input")
        decode.add_argument("--force", action="store_true", help="replace an existing --output")
        decode.set_defaults(run=run)

    score = sub.add_parser("score", help="BLEU of hypotheses against references")
    score.add_argument("--ref", required=True, help="reference file, one sentence a line")
    score.add_argument("--hyp", help="hypothesis file (default: stdin)")
    score.add_argument("--lang", default="en", help="target language for the paper protocol's Moses tokenizer")
    score.add_argument("--parse", action="store_true", help="score bracketed trees (F1, EVALB conventions)")
    score.set_defaults(run=cmd_score)

    from aiayn.visualize import ATTENTION_MAX_TOKENS

    attention = sub.add_parser("attention", help="attention heatmaps of one sentence (Figures 3-5)")
    attention.add_argument("run_dir", metavar="RUN_DIR")
    attention.add_argument("--sentence", required=True)
    attention.add_argument("--out", default="attention", help="folder for the PNG files (default ./attention)")
    add_decode_arguments(attention, "translate", ["beam", "alpha"])
    attention.add_argument("--device", default="auto")
    attention.add_argument("--max-tokens", type=int, default=ATTENTION_MAX_TOKENS,
                           help=f"refuse a sentence or translation longer than this (default {ATTENTION_MAX_TOKENS})")
    attention.add_argument("--force", action="store_true", help="replace an existing --out folder")
    attention.set_defaults(run=cmd_attention)

    from aiayn.serve import (
        DRAIN_SECONDS, MAX_ATTENTION_MIB, MAX_BATCH_MIB, MAX_CONNECTIONS, MAX_INPUT_TOKENS, MAX_QUEUE, MAX_TEXTS,
        MAX_WAIT_MS, READ_TIMEOUT,
    )

    serve = sub.add_parser("serve", help="serve a model over HTTP: batched POST /translate and a page with the attention")
    serve.add_argument("run_dir", metavar="RUN_OR_MODEL_DIR", help="a run folder, a checkpoint or a model folder")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    add_decode_arguments(serve, "translate", ["precision", "batch_tokens"])
    serve.add_argument("--max-wait-ms", type=float, default=MAX_WAIT_MS,
                       help=f"how long a request waits for others to share its batch (default {MAX_WAIT_MS:g})")
    serve.add_argument("--max-queue", type=int, default=MAX_QUEUE,
                       help=f"texts waiting before requests get 503 (default {MAX_QUEUE})")
    serve.add_argument("--max-texts", type=int, default=MAX_TEXTS, help=f"texts in one request (default {MAX_TEXTS})")
    serve.add_argument("--max-input-tokens", type=int, default=MAX_INPUT_TOKENS,
                       help=f"tokens in one text (default {MAX_INPUT_TOKENS})")
    serve.add_argument("--max-batch-mib", type=float, default=MAX_BATCH_MIB,
                       help=f"decoding state of one batch: beam search's keys, values and logits (default {MAX_BATCH_MIB})")
    serve.add_argument("--max-attention-mib", type=float, default=MAX_ATTENTION_MIB,
                       help=f"attention maps of one answer (default {MAX_ATTENTION_MIB})")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                       help=f"open connections; over it idle ones are closed, else 503 (default {MAX_CONNECTIONS})")
    serve.add_argument("--read-timeout", type=float, default=READ_TIMEOUT,
                       help=f"seconds a request may take to arrive whole, else 408 (default {READ_TIMEOUT:g})")
    serve.add_argument("--drain-seconds", type=float, default=DRAIN_SECONDS,
                       help=f"on SIGTERM or Ctrl-C, decode the queue for this long, then answer the rest 503 "
                            f"(default {DRAIN_SECONDS:g})")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(run=cmd_serve)

    from aiayn.experiment import ROWS, SCALES

    experiment = sub.add_parser("experiment", help="rerun an experiment of the paper in miniature")
    experiments = experiment.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    table3 = experiments.add_parser(
        "table3", help="train the base model and every variation of Table 3, print ours beside the paper's")
    table3.add_argument("--out", required=True, help="experiment folder (continued when it holds this experiment)")
    table3.add_argument("--scale", default="small", choices=list(SCALES),
                        help="miniature size (default small: about two hours on a 2-core CPU)")
    table3.add_argument("--steps", type=int, default=None, help="training steps of every row (default: the scale's)")
    table3.add_argument("--rows", nargs="+", metavar="ROW",
                        help=f"rows or groups to run (default all): {' '.join(ROWS)}, or A B C D E")
    table3.add_argument("--precision", default="bf16", choices=PRECISIONS)
    table3.add_argument("--seed", type=int, default=1)
    table3.add_argument("--corpus", default="bible-en-es", help="corpus (default bible-en-es)")
    table3.set_defaults(run=cmd_experiment_table3)

    demo = sub.add_parser("demo", help="train on bible-en-es for a time budget, translate the test books, score")
    demo.add_argument("--minutes", type=float, default=10.0, help="training time budget (default 10)")
    demo.add_argument("--out", default="runs/demo", help="run folder (default runs/demo; reused if present)")
    demo.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model preset (default small)")
    demo.add_argument("--precision", default="bf16", choices=PRECISIONS, help="training and decoding (default bf16)")
    demo.add_argument("--recipe", default=DEMO_RECIPE_NAME, choices=sorted(RECIPES),
                      help=f"a new run's recipe: fast (pre-norm) or paper (§3.1's post-norm) (default {DEMO_RECIPE_NAME})")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--test-sentences", type=int, default=None, help="translate only the first N test verses")
    add_decode_arguments(demo, "translate", ["beam", "alpha"])
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM (a scheduler, `kill`) unwinds like Ctrl-C, so that partial outputs are reported.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        args.run(args)
    except (UserError, ValueError, ImportError, OSError) as error:  # OSError: files, network
        parser.exit(2, f"aiayn: error: {' '.join(str(error).split())}\n")
    except KeyboardInterrupt:
        parser.exit(130, "aiayn: interrupted\n")
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
