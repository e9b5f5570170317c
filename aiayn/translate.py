"""Translating many sentences (§6.1): a `Translator` holds a model's decoding copy (made once), its
tokenizer and a `DecodeConfig`; underneath, the model is a search's step function (`ModelStep`),
sentences go through the search in length-sorted batches and come back in input order, and streams
of lines go through in chunks, so memory stays flat and every finished chunk is written
(aiayn.decode_files: the commands over files)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from os import PathLike
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from aiayn import kernels
from aiayn.config import DECODE_PRESETS, MAX_INPUT_TOKENS, DecodeConfig, check_whole
from aiayn.device import resolve_device
from aiayn.graphs import GraphedStep
from aiayn.inference import inference_copy
from aiayn.model import Transformer
from aiayn.run import check_vocabulary, load_for_inference
from aiayn.search import BeamSearch, Hypothesis, beam_search
from aiayn.lines import visible
from aiayn.sentences import interleave


class ModelStep:
    """A Transformer as the step function of aiayn.search. It encodes the source once and fills
    the decoding state (aiayn.cache: every layer's encoder-decoder keys and values, empty
    self-attention buffers for `max_len` positions) for a search of `beam` beams; each step then
    feeds one token per row."""

    def __init__(self, model: Transformer, src: Tensor, max_len: int, beam: int = 1) -> None:
        if model.training:  # dropout would make every search's outputs differ
            raise ValueError("decoding needs the model in eval mode: call model.eval() first")
        self.model = model
        memory, mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        self.cache = model.init_cache(memory, mask, max_len, beam)

    def join(self, src: Tensor, max_len: int, rows_each: int) -> None:
        """Sentences `src` (N, S) join the decoding state after those in it, with `rows_each`
        rows each (the search's width) and up to `max_len` positions."""
        memory, mask = self.model.encode(src)  # (N, S, d_model), (N, 1, 1, S)
        self.cache.join(self.model.memory_keys_values(memory), mask, rows_each, max_len)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens: (B,) -> log-probabilities of the next token (B, V), in fp32."""
        return self.model.next_log_probs(tokens, self.cache)

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        self.cache.reorder(rows, sentences, beam)


# The model to decode with in a precision: a copy with its weights cast, quantized or laid out once
# (aiayn.inference), so that no step does it again. Callers that decode many times with the same
# weights make it once.
decoding_model = inference_copy


def check_progress(progress: Optional[object]) -> None:
    """A progress bar is something with tqdm's `update` (found in review: progress="yes" was an
    AttributeError after the first batch was decoded)."""
    if progress is not None and not callable(getattr(progress, "update", None)):
        raise TypeError(f"progress takes a tqdm bar (Translator.translate: or True, for one of its own), not a "
                        f"{type(progress).__name__}")


def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    decode: DecodeConfig = DECODE_PRESETS["translate"],
    progress: Optional[object] = None,
    **changes,
) -> list[list[int]]:
    """Decode each source (token ids, without EOS) and return the output ids in input order, as
    `decode` says (§6.1 by default: beam 4, α = 0.6, source length + 50); `changes` replace its
    fields (`translate_ids(model, ids, beam=1)` is greedy). The output is at most source length +
    `extra_len` tokens (and at most `max_output_len`, when set) and, unless the limit is
    shorter, at least `min_len`.

    Sentences are sorted by length and packed up to `batch_tokens` source tokens per batch
    (times the beam), so little compute goes to padding.
    """
    if "n_best" in changes:  # it would be passed on, and all but the best output dropped
        raise TypeError("translate_ids returns one output per source: for n_best, Translator.alternatives(sentences, "
                        "n_best) of text, translate_nbest of token ids")
    return [outputs[0] for outputs in translate_nbest(model, sources, decode, progress, **changes)]


def translate_nbest(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    decode: DecodeConfig = DECODE_PRESETS["translate"],
    progress: Optional[object] = None,
    n_best: int = 1,
    **changes,
) -> list[list[list[int]]]:
    """`translate_ids` with the `n_best` best outputs of each source, best first (fewer where the
    search finished fewer; beam search only, n_best ≤ beam)."""
    if not isinstance(decode, DecodeConfig):  # a dict of settings failed later on `.beam`
        raise TypeError(f"decode must be a DecodeConfig, got {type(decode).__name__}; give single settings as "
                        "keywords (beam=2)")
    decode = dataclasses.replace(decode, **changes) if changes else decode
    if isinstance(sources, Iterator):  # read once, as Translator.translate reads one (found by a misuse hunt: "no len()")
        sources = list(sources)
    check_sources(sources)
    check_progress(progress)
    config = model.config
    BeamSearch.check_n_best_of(n_best, decode.beam)  # before any batch is encoded
    check_beam(config, decode.beam)
    device = next(model.parameters()).device
    was_training = model.training
    beam = decode.beam
    # An empty source has an empty translation, undecoded: min_len would make it invent one (found in review).
    order = sorted((i for i in range(len(sources)) if len(sources[i])), key=lambda i: len(sources[i]))
    results: list[list[list[int]]] = [[] if len(source) else [[]] for source in sources]
    if progress is not None:
        progress.update(len(sources) - len(order))
    start = 0
    try:
        model.eval()
        decoder = decoding_model(model, decode.precision)
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * (len(sources[order[end]]) + 1) * beam <= decode.batch_tokens:
                end += 1
            chunk = order[start:end]
            src, max_len = padded_batch(config, [sources[i] for i in chunk], decode)
            for i, out in zip(chunk, _search_batch(decoder, src.to(device), max_len.to(device), decode, n_best)):
                results[i] = out
            if progress is not None:
                progress.update(len(chunk))
            start = end
    finally:
        model.train(was_training)
    return results


@torch.inference_mode()
def _search_batch(decoder: Transformer, src: Tensor, max_len: Tensor, decode: DecodeConfig,
                  n_best: int) -> list[list[list[int]]]:
    """The outputs of one batch (src (N, S), max_len (N,), on the decoder's device), each the
    best then its alternatives. Greedy is the search of beam 1 with α = 0 (aiayn.search.greedy).
    A score that is not a number (`scored`) would otherwise end in an empty line: it is an error."""
    config, beam = decoder.config, decode.beam
    if decode.cuda_graphs and src.is_cuda and GraphedStep.fits(config):
        stepper = GraphedStep(decoder, src, int(max_len.max()) + 1, beam)
    else:
        stepper = ModelStep(decoder, src, int(max_len.max()) + 1, beam)
    hypotheses = beam_search(stepper.step, stepper.reorder, config.bos_id, config.eos_id, max_len, beam,
                             decode.alpha if beam > 1 else 0.0, decode.min_len, decode.no_repeat_ngram_size,
                             decode.repetition_penalty, n_best, decode.stop)
    if not all(scored(h, decode) for h in hypotheses):
        raise not_numbers(decode.precision)
    return [[h.tokens] + [a.tokens for a in h.alternatives] for h in hypotheses]


def scored(hypothesis: Hypothesis, decode: DecodeConfig) -> bool:
    """Whether a search's best hypothesis has a score. NaN: the decoding precision overflowed
    (fp16's range, where bf16 and fp32 have room). -inf: no hypothesis finished, which finite
    log-probabilities never give (EOS is open at the output limit), unless the guards banned
    every token (a no-repeat n-gram of 1 over a small vocabulary): an empty output then, as ever."""
    guarded = decode.no_repeat_ngram_size > 0 or decode.repetition_penalty != 1.0
    return not math.isnan(hypothesis.log_prob) and (hypothesis.log_prob > float("-inf") or guarded)


def not_numbers(precision: str) -> ValueError:
    """The error of a search whose scores are not numbers: fp16's range overflowed, or in any
    other precision (fp32's range) the model's weights or activations are not finite."""
    why = ("activations overflow it; decode in bf16 or fp32" if precision == "fp16" else
           "weights or activations are not finite; check the weights (a diverged run?)")
    return ValueError(f"decoding in {precision} gave scores that are not numbers (NaN or -inf): the model's {why}")


def padded_batch(config, sources: Sequence[Sequence[int]], decode: DecodeConfig,
                 width: Callable[[int], int] = lambda longest: longest) -> tuple[Tensor, Tensor]:
    """Sources (token ids without EOS) as one batch: src (N, S) with EOS, padded to S = `width`
    of the longest; max_len (N,) the most output tokens of each (source + `extra_len`, at most
    `max_output_len`, and no more than learned positions allow)."""
    need = max(len(ids) + 1 for ids in sources)
    if (longest := width(need)) < need:  # `width` held to the learned positions (found in review: a size error)
        raise ValueError(f"position {need - 1} is beyond the {config.max_len} learned positions (max_len)")
    src = torch.full((len(sources), longest), config.pad_id, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids) + 1] = torch.tensor(list(ids) + [config.eos_id])
    max_len = torch.tensor([len(ids) + decode.extra_len for ids in sources])
    if decode.max_output_len is not None:
        max_len = max_len.clamp(max=decode.max_output_len)
    if config.positional == "learned":  # the search may feed one position past the limit
        max_len = max_len.clamp(max=config.max_len - 1)
    return src, max_len


def cut_at_limit(config, source: Sequence[int], output: Sequence[int], decode: DecodeConfig) -> bool:
    """Whether the search stopped `output` at the length limit of `source`, without scoring EOS:
    the last row of its decoder's attention is then no </s>'s."""
    return len(output) >= int(padded_batch(config, [source], decode)[1][0])


def check_sources(sources: Sequence[Sequence[int]]) -> None:
    """Token ids, a list of ints per sentence: a string, a flat list of ids or float ids are
    refused in one line (they failed deep in PyTorch, or floats were cut to ids)."""
    if isinstance(sources, (str, bytes)) or (isinstance(sources, Tensor) and sources.dim() != 2):
        raise TypeError("sources must be a list of token-id lists, one per sentence: encode text with the tokenizer, "
                        "or call Translator.translate")
    for number, source in enumerate(sources):
        ids = source.tolist() if hasattr(source, "tolist") else source  # a tensor's or an array's ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or \
                not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids):
            raise TypeError(f"sources[{number}] must be a list of token ids (ints), got {type(source).__name__} "
                            f"{str(source)[:40]!r}: encode text with the tokenizer, or call Translator.translate")


def check_beam(config, beam: int) -> None:
    """A beam wider than the vocabulary would keep the same output twice: refused in one line."""
    if beam > config.vocab_size:
        raise ValueError(f"beam {beam} is more than the model's {config.vocab_size} tokens: choose a beam of at "
                         f"most {config.vocab_size}")


class ContinuousDecoding:
    """Continuous batching: sentences join the running search (aiayn.search.BeamSearch) between
    two steps and leave it as soon as they finish, instead of waiting for a whole batch to end.
    A server's decoding thread keeps one per beam size: every sentence has its own α, number of
    outputs and output limit. `model` is a decoding copy (`decoding_model`)."""

    def __init__(self, model: Transformer, decode: DecodeConfig = DECODE_PRESETS["translate"]) -> None:
        self.model, self.decode, self.config = model, decode, model.config
        check_beam(self.config, decode.beam)
        self.device = next(model.parameters()).device
        self.state: Optional[ModelStep] = None
        self.search = BeamSearch(lambda tokens: self.state.step(tokens),
                                 lambda *rows: self.state.reorder(*rows),
                                 self.config.bos_id, self.config.eos_id, self.device, decode.beam, decode.min_len,
                                 decode.no_repeat_ngram_size, decode.repetition_penalty, decode.stop)

    @property
    def live(self) -> int:
        """Sentences decoding."""
        return self.search.live

    def join(self, sources: Sequence[Sequence[int]], keys: list, alpha: float, n_best: int = 1,
             max_output_len: Optional[int] = None) -> None:
        """Sources (token ids without EOS) join; `step` gives their `keys` back as they finish."""
        self.search.check_n_best(n_best)
        decode = dataclasses.replace(self.decode, max_output_len=max_output_len)
        room = self.config.max_len if self.config.positional == "learned" else float("inf")  # no position past it
        src, max_len = padded_batch(self.config, sources, decode, lambda n: min(kernels.source_width(n), room))
        src, positions = src.to(self.device), int(max_len.max()) + 1
        with torch.inference_mode():
            # The model's state first: should encoding fail, the search has not changed.
            if not self.search.live:
                self.state = ModelStep(self.model, src, positions, self.decode.beam)
            else:
                self.state.join(src, positions, self.search.width)
            self.search.join(max_len.to(self.device), keys, alpha, n_best)

    def cut(self, which: Callable[[Any], bool]) -> list:
        """The sentences whose key `which` holds end at the next step (aiayn.search.BeamSearch.cut);
        returns their keys."""
        return self.search.cut(which)

    def step(self) -> list[tuple]:
        """One step of every sentence decoding; returns (key, [output ids, then the alternatives])
        of those that finished, or (key, the ValueError) for one whose scores are not numbers."""
        with torch.inference_mode():
            finished = self.search.step()
        if not self.search.live:
            self.state = None  # the next sentence starts a fresh state
        return [(key, [h.tokens] + [a.tokens for a in h.alternatives] if scored(h, self.decode)
                 else not_numbers(self.decode.precision)) for key, h in finished]


def input_token_limit(config, max_input_tokens: int) -> int:
    """The longest source a model takes: `max_input_tokens`, and for learned positions (Table 3
    row E) no more than source + EOS fit in `max_len`."""
    if config.positional == "learned":
        return min(max_input_tokens, config.max_len - 1)
    return max_input_tokens


# Lines read, decoded and written together: enough to fill length-sorted batches, few enough that
# memory does not grow with the file and an interruption loses little. The first chunk is smaller
# and each next one twice the last, up to CHUNK_LINES: a short file interrupted keeps most of what
# was decoded (a file under 1,000 lines kept nothing), and a long one is decoded in full chunks.
CHUNK_LINES = 1000
FIRST_CHUNK_LINES = 100


def chunk_sizes(done: int, chunk_lines: int = CHUNK_LINES) -> Iterator[int]:
    """The lines of each chunk after the first `done` lines of a file: its chunks cut where a run
    from its first line cuts them, so that a resumed run batches each line with the lines an
    uninterrupted one does (in bf16 and int8 a line's translation can depend on them)."""
    end, size = 0, min(FIRST_CHUNK_LINES, chunk_lines)
    while True:
        end += size
        if end > done:
            yield end - done
            done = end
        size = min(2 * size, chunk_lines)


def _chunk_sources(tokenizer, chunk: list[str], texts: list[str], split, limit: int, note, first_line: int):
    """The ids of every piece of a chunk (a line's sentences with `split`, else the line), each
    cut to `limit` tokens with a `note`; and (offset, pieces, the text around them) of each line
    that has something to translate."""
    sources, where = [], []
    for offset, (line, text) in enumerate(zip(chunk, texts)):
        if not text:
            continue
        pieces, rest = split(line) if split else ([text], ["", ""])  # around: the line's own spaces
        for ids in tokenizer.encode_batch(pieces):
            if len(ids) > limit:
                note(f"line {first_line + offset} has {len(ids)} tokens; using its first {limit}")
                ids = ids[:limit]
            sources.append(ids)
        where.append((offset, len(pieces), rest))
    return sources, where


def translate_stream(
    model: Transformer,
    tokenizer,
    lines: Iterable[str],
    write: Callable[[list[str]], None],
    *,
    max_input_tokens: int = MAX_INPUT_TOKENS,
    finish: Callable[[str, str], str] = lambda line, output: output,
    chunk_lines: int = CHUNK_LINES,
    note: Callable[[str], None] = lambda _: None,
    first_line: int = 1,
    progress: Optional[object] = None,
    decode: DecodeConfig = DECODE_PRESETS["translate"],
    split: Optional[Callable[[str], tuple[list[str], list[str]]]] = None,
    n_best: int = 1,
    **changes,
) -> int:
    """Decode one sentence a line, in chunks (`chunk_sizes`, from line `first_line`), each chunk's
    outputs handed to `write` in input order once it is done; returns the number of lines. With
    `split` (aiayn.sentences.split_sentences for a language), a line is a paragraph: its
    sentences are decoded with the chunk's and put back between its own spaces. With `n_best`,
    each line gives that many lines, its best outputs first ("" past those the search finished).

    An empty line gives an empty line; one longer than `max_input_tokens` tokens (or than a
    learned-position model's `max_len` allows) is cut to fit, with a `note`. `finish(line,
    output)` turns a decoded output into the line written (the parser builds a tree there); a
    line break the model spells becomes a space, so the output keeps `n_best` lines per input line.
    `decode` and `changes` are those of `translate_ids`.
    """
    if split and n_best > 1:
        raise ValueError("n_best needs whole lines: the sentences of a paragraph have no alternatives together")
    # (found by a misuse hunt: chunk_lines=0 looped for ever, max_input_tokens=0 cut every line to "")
    check_whole(max_input_tokens=max_input_tokens, chunk_lines=chunk_lines, first_line=first_line, least=1)
    check_progress(progress)
    decode = dataclasses.replace(decode, **changes) if changes else decode
    limit = input_token_limit(model.config, max_input_tokens)
    decoder = decoding_model(model, decode.precision)  # cast once, not per chunk
    count, chunk = 0, []  # lines done; the lines read and not yet decoded

    def flush() -> None:
        texts = [visible(line) for line in chunk]  # "" for a line with nothing to translate
        sources, where = _chunk_sources(tokenizer, chunk, texts, split, limit, note, first_line + count)
        bar = None if split else progress
        found = iter(translate_nbest(decoder, sources, decode, bar, n_best))
        if progress is not None:
            progress.update(len(chunk) if split else len(chunk) - len(where))  # (the empty lines)
        decoded = [[""] * n_best for _ in chunk]
        for offset, pieces, rest in where:
            best = [next(found) for _ in range(pieces)]  # each piece's outputs, best first
            decoded[offset] = [" ".join(interleave([tokenizer.decode(b[k]) for b in best], rest).splitlines())
                               if all(k < len(b) for b in best) else "" for k in range(n_best)]
        write([finish(line, out) if text else "" for line, text, outs in zip(chunk, texts, decoded) for out in outs])

    size = next(sizes := chunk_sizes(first_line - 1, chunk_lines))
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            flush()
            count += len(chunk)
            chunk, size = [], next(sizes)
    if chunk:
        flush()
        count += len(chunk)
    return count


class Translator:
    """A model ready to translate: its decoding copy in `decode.precision` (cast or quantized once,
    here, and nowhere else on the way), its tokenizer, and the decoding settings (§6.1's by
    default). Every "translate and score" of the package goes through one (aiayn.evaluate.score).
    The copy holds weights of its own (laid out, cast or quantized), or, where it needs none (fp32
    on a GPU, inside `reference_math()`), is the model itself: after training changes the model,
    make a new Translator."""

    def __init__(self, model: Transformer, tokenizer=None, decode: DecodeConfig = DECODE_PRESETS["translate"]) -> None:
        if not isinstance(decode, DecodeConfig):
            raise ValueError(f"decode takes a DecodeConfig (DecodeConfig(beam=1)), not a {type(decode).__name__}")
        # Checked here as Translator.load checks them (found in review: an AttributeError, or an
        # IndexError in SentencePiece after a whole decoding, for a tokenizer of another model).
        if not isinstance(model, Transformer):
            raise TypeError(f"Translator takes a Transformer, not a {type(model).__name__}" + (
                f"; for a folder or checkpoint: Translator.load({str(model)!r})" if isinstance(model, (str, PathLike)) else ""))
        if tokenizer is not None:
            if not hasattr(tokenizer, "encode_batch"):
                raise TypeError(f"tokenizer takes a Tokenizer (aiayn.tokenizer.load_tokenizer(folder)), not a "
                                f"{type(tokenizer).__name__}")
            check_vocabulary(tokenizer, model.config)
        self.decode = decode
        self.tokenizer = tokenizer
        self.model = decoding_model(model, decode.precision)

    @classmethod
    def load(cls, path, device: str = "auto", decode: DecodeConfig = DECODE_PRESETS["translate"]) -> "Translator":
        """From a model folder, a checkpoint or a run folder (aiayn.run.load_for_inference)."""
        if isinstance(device, DecodeConfig):  # (found by a misuse hunt: PyTorch's many-line TypeError of torch.device)
            raise TypeError("the second argument of Translator.load is the device: Translator.load(path, decode=...)")
        model, tokenizer = load_for_inference(path, resolve_device(device))
        return cls(model, tokenizer, decode)

    def __repr__(self) -> str:
        c = self.config
        return (f"Translator(d_model={c.d_model}, n_layers={c.n_layers}, vocab_size={c.vocab_size}, device={self.device}, "
                f"tokenizer={self.tokenizer!r}, decode={self.decode!r})")

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def translate_ids(self, sources: Sequence[Sequence[int]], progress: Optional[object] = None, **changes) -> list[list[int]]:
        """Output ids of each source (ids without EOS), in input order; `changes` replace fields of
        the decoding settings for this call (not the precision: the copy is made)."""
        return translate_ids(self.model, sources, self.decode, progress, **self._changes(changes))

    def translate_nbest(self, sources: Sequence[Sequence[int]], n_best: int, **changes) -> list[list[list[int]]]:
        """The `n_best` best outputs of each source, best first (aiayn.translate.translate_nbest)."""
        return translate_nbest(self.model, sources, self.decode, None, n_best, **self._changes(changes))

    def translate(self, sentences: Sequence[str], progress: Optional[object] = None, **changes) -> list[str]:
        """Detokenized translations of `sentences` (a list of strings), in order; `progress` (a
        tqdm bar) is advanced by each batch's sentences as it is done."""
        sentences = self._texts(sentences, "translate", "translate([text])[0] for one")
        if progress is True:  # as score(progress=True): a bar of its own (found in review: an AttributeError)
            from tqdm.auto import tqdm

            with tqdm(total=len(sentences), desc="translate", unit="sentence") as bar:
                return self.translate(sentences, bar, **changes)
        outputs = self.translate_ids(self.tokenizer.encode_batch([visible(s) for s in sentences]), progress or None, **changes)
        return [self.tokenizer.decode(ids) for ids in outputs]

    def alternatives(self, sentences: Sequence[str], n_best: int, **changes) -> list[list[str]]:
        """The `n_best` best translations of each of `sentences`, best first (fewer where the
        search finished fewer; n_best ≤ beam), as `aiayn translate --n-best` gives them: two outputs
        of other pieces may read the same (found by a misuse hunt: text had no n-best in Python)."""
        sentences = self._texts(sentences, "alternatives", "alternatives([text], n_best)[0] for one")
        outputs = self.translate_nbest(self.tokenizer.encode_batch([visible(s) for s in sentences]), n_best, **changes)
        return [[self.tokenizer.decode(ids) for ids in best] for best in outputs]

    def _texts(self, sentences, method: str, instead: str) -> list[str]:
        """`sentences` as a list, each checked to be a string (a generator has no length for a bar)."""
        self._check_text_input(sentences, method, instead)
        sentences = list(sentences)
        wrong = [s for s in sentences if not isinstance(s, str)][:1]  # (None is one: not a sentinel)
        if wrong:  # (found in review: SentencePiece's "List elements must be str or bytes")
            raise TypeError(f"{method} takes a list of strings, not of {type(wrong[0]).__name__}: {wrong[0]!r}"[:200])
        return sentences

    def _changes(self, changes: dict) -> dict:
        """A call's settings: single fields; the precision is the copy's, made once (found in
        review: decode= was a TypeError of 'multiple values', precision= blamed the copy)."""
        if "decode" in changes:
            raise TypeError("a Translator decodes with the settings it was made with: give a call's changes as "
                            "keywords (beam=2), or make a Translator with decode=DecodeConfig(...)")
        if changes.get("precision", self.decode.precision) != self.decode.precision:
            raise ValueError(f"this Translator decodes in {self.decode.precision}, with a copy of the model made once; "
                             f"for {changes['precision']}: Translator.load(path, decode=DecodeConfig(precision="
                             f"{changes['precision']!r}))")
        return changes

    def _check_text_input(self, texts, method: str, instead: str) -> None:
        if isinstance(texts, str):  # else each character would be a sentence
            raise ValueError(f"{method} takes a list of sentences, not a string: {instead}")
        if self.tokenizer is None:
            raise ValueError("this Translator has no tokenizer: give one, or call translate_ids with token ids")

    def stream(self, lines: Iterable[str], write: Callable[[list[str]], None], **options) -> int:
        """`translate_stream` with this translator's model, tokenizer and settings."""
        self._check_text_input(lines, "stream", "a file's lines, or text.splitlines()")  # (found in review: unchecked)
        if not callable(write):
            raise TypeError(f"write takes a function of a list of lines, not a {type(write).__name__}")
        return translate_stream(self.model, self.tokenizer, lines, write, decode=self.decode, **self._changes(options))
