"""The decoding commands over files: `aiayn translate` and `aiayn parse`, a file (or stdin)
streamed through a `Translator` in chunks to `--output` (a `PartialOutput`: resumable) or stdout;
and `aiayn attention`, one sentence's translation and every layer's and head's attention maps."""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Callable

from aiayn.checkpoint import WEIGHTS
from aiayn.config import AttentionOptions, DecodeConfig, FileDecodeOptions, TranslateFileOptions
from aiayn.files import file_sha256, refuse_to_replace
from aiayn.resumable import PartialOutput
from aiayn.graphs import GraphedStep
from aiayn.lines import check_input, iter_lines, open_input, visible
from aiayn.parsing import WORD_PLACEHOLDER, holds_trees, parser_vocabulary
from aiayn.run import languages_of, model_inputs, pinned_model_dir, run_files, stderr_note
from aiayn.sentences import split_sentences
from aiayn.translate import CHUNK_LINES, Translator, cut_at_limit
from aiayn.visualize import attention_figures


def _count_lines(handle) -> int:
    """Lines in a binary file as `iter_lines` splits them (a last line without "\\n" counts),
    the handle rewound."""
    count, last = 0, b"\n"
    for block in iter(lambda: handle.read(1 << 20), b""):
        count, last = count + block.count(b"\n"), block[-1:]
    handle.seek(0)
    return count + (last != b"\n")


def _partial_output(options: FileDecodeOptions, decode: DecodeConfig, command: str, paragraphs: bool,
                    n_best: int) -> PartialOutput:
    """--output, recording what its lines depend on, by flag; not the speed knobs, so that a run
    stopped for memory may resume with smaller batches; --lang only where it splits."""
    reads = model_inputs(options.run_dir)  # the model folder first, then its tokenizer's files
    flags = {**dataclasses.asdict(decode), "max_input_tokens": options.max_input_tokens,
             "split_sentences": paragraphs, "lang": options.lang if paragraphs else None, "n_best": n_best}
    settings = {"model": file_sha256(reads[0] / WEIGHTS), "command": command,
                **{f"--{name.replace('_', '-')}": value for name, value in flags.items()
                   if name not in ("batch_tokens", "cuda_graphs")}}
    out = PartialOutput(options.output, options.input, options.resume, options.force, reads, settings,
                        kept=run_files(options.output), loose={"--batch-tokens": decode.batch_tokens}, per_line=n_best,
                        older={"--n-best": 1, "--stop": "beams"})
    if out.nothing_to_resume:  # as a script that always passes --resume expects; said (found by a newcomer's run)
        stderr_note(f"nothing to resume: there is no {out.partial}; translating from the first line")
    if out.changed and decode.precision != "fp32":  # (found in review: said nowhere)
        print(f"aiayn: note: {out.partial} was translated with {out.changed[0]}: in {decode.precision} a line's "
              "translation can differ a little with the lines batched beside it", file=sys.stderr)
    return out


def _refuse_trees(path: str) -> None:
    """`parse` takes sentences: a treebank given instead was decoded for hours into trees of its
    brackets (found by a misuse hunt)."""
    with open(path, encoding="utf-8", errors="replace") as file:
        head = [line for line, _ in zip(file, range(20))]
    if holds_trees(head):
        raise ValueError(f"{path} holds bracketed trees; parse takes one tokenized sentence a line (aiayn corpus "
                         "export TREEBANK --split test --out DIR writes a treebank's sentences)")


def translate_file(options: FileDecodeOptions, decode: DecodeConfig, command: str = "translate",
                   finish: Callable[[str, str], str] = lambda line, output: output) -> None:
    """`aiayn translate` / `parse`: stream --input (or stdin) through the model of --run-dir in
    chunks, to --output (through a `PartialOutput`) or stdout, with a progress bar on a terminal."""
    from tqdm.auto import tqdm

    options = dataclasses.replace(options, run_dir=str(pinned_model_dir(options.run_dir, stderr_note)))  # digest and load alike
    out = None
    paragraphs = isinstance(options, TranslateFileOptions) and options.split_sentences
    n_best = options.n_best if isinstance(options, TranslateFileOptions) else 1
    if n_best > decode.beam:  # before any file is made
        raise ValueError(f"--n-best {n_best} needs --beam {n_best} or more: the beam holds the alternatives")
    if command == "parse" and options.input not in (None, "-") and Path(options.input).is_file():
        _refuse_trees(options.input)
    if options.output:
        check_input(options.input)  # its mistake said before the output's checks, which name it as an input
        out = _partial_output(options, decode, command, paragraphs, n_best)
    skip = out.skip if out else 0

    def write(lines: list[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        if out is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            out.write(text, len(lines) // n_best)  # the input lines they translate

    try:
        translator = Translator.load(options.run_dir, options.device, decode)  # the fp32 weights are let go
        source, name = open_input(options.input)
        total = None
        if source is not sys.stdin.buffer and source.seekable():  # a named pipe is read once, uncounted (found in review)
            total = _count_lines(source) - skip
            if total < 0:
                raise ValueError(f"{out.partial} holds {skip} lines but {name} has {total + skip}: "
                                 "--resume needs the same input")
        interactive = source is sys.stdin.buffer and sys.stdin.isatty()
        on_gpu = translator.device.type == "cuda"
        if decode.cuda_graphs and not (on_gpu and GraphedStep.fits(translator.config)):  # a speed knob: said, not refused
            why = "with this model's restricted self-attention" if on_gpu else f"on the {translator.device.type.upper()}"
            stderr_note(f"--cuda-graphs needs a CUDA GPU and full self-attention: {why}, each step runs as without it")
        if command == "parse" and not parser_vocabulary(translator.tokenizer):
            stderr_note(f"{options.run_dir} looks like no parsing model: {WORD_PLACEHOLDER}, the word of a linearized tree, is no piece "
                 "of its vocabulary (a translation model's outputs come out as flat trees of XX-tagged words)")
        with source, tqdm(total=total, desc=command, unit="line", disable=not sys.stderr.isatty()) as bar:
            split = functools.partial(split_sentences, lang=options.lang or languages_of(options.run_dir)[0] or "en") \
                if paragraphs else None
            lines = iter_lines(source, name) if out is None else out.lines(iter_lines(source, name), name)
            translator.stream(lines, write, max_input_tokens=options.max_input_tokens,
                              finish=finish, chunk_lines=1 if interactive else CHUNK_LINES, note=stderr_note,
                              first_line=skip + 1, progress=bar, split=split, n_best=n_best)
    except BaseException as error:
        if out is not None:
            out.abandon(isinstance(error, KeyboardInterrupt))
        raise
    if out is not None:
        out.finish()


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".svgz", ".pdf", ".eps", ".ps", ".tif", ".tiff", ".webp", ".gif", ".bmp")


def attention_command(options: AttentionOptions, decode: DecodeConfig, echo=print) -> None:
    """`aiayn attention`: translate one sentence, then draw every layer's and head's attention."""
    if Path(options.out).suffix.lower() in IMAGE_SUFFIXES:  # (found in review: a folder named maps.png was made)
        raise ValueError(f"--out is the folder the figures go in, one per kind and layer; name a folder, not "
                         f"{Path(options.out).name}")
    translator = Translator.load(options.run_dir, options.device, decode)
    refuse_to_replace(options.out, options.force, inputs=model_inputs(options.run_dir), folder=True, kept=run_files(options.out))
    source = options.sentence.strip()
    if any("\udc80" <= c <= "\udcff" for c in source):  # bytes Python could not decode: sentencepiece's traceback
        raise ValueError("--sentence is not valid UTF-8 (what encoding does the terminal use?)")
    if not visible(source):  # (found in review: U+200B alone was translated, an invented sentence drawn)
        raise ValueError("--sentence is empty" + (" but for invisible characters" if source else ""))
    ids = translator.tokenizer.encode(source)

    def check_length(tokens: int, side: str) -> None:
        if tokens > options.max_tokens:
            raise ValueError(f"the {side} has {tokens} tokens, over --max-tokens {options.max_tokens} (its maps would be "
                             f"{tokens + 1} positions across, with </s>); give a shorter sentence or raise --max-tokens")

    check_length(len(ids), "sentence")
    target = translator.translate_ids([ids])[0]
    check_length(len(target), "translation")
    echo(f"source       {source}\ntranslation  {translator.tokenizer.decode(target)}")
    cut = cut_at_limit(translator.model.config, ids, target, translator.decode)
    for path in attention_figures(translator.model, translator.tokenizer, source, target, Path(options.out),
                                  force=options.force, cut=cut):
        echo(path)
