"""Translating many sentences: the model as a search's step function (`ModelStep`),
length-sorted batches through the search, results in input order; files streamed through in
chunks, so memory stays flat and every finished chunk is written."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor

from aiayn import kernels
from aiayn.config import DECODE_PRESETS, DecodeConfig
from aiayn.model import Transformer
from aiayn.search import beam_search, greedy


class ModelStep:
    """A Transformer as the step function of aiayn.search. It encodes the source once and fills
    the decoding state (aiayn.cache: every layer's encoder-decoder keys and values, empty
    self-attention buffers for `max_len` positions) for a search of `beam` beams; each step then
    feeds one token per row."""

    def __init__(self, model: Transformer, src: Tensor, max_len: int, beam: int = 1) -> None:
        self.model = model
        memory, mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        self.cache = model.init_cache(memory, mask, max_len, beam)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens: (B,) -> log-probabilities of the next token (B, V), in fp32."""
        logits = self.model.decode(tokens.unsqueeze(1), cache=self.cache)  # (B, 1, V)
        return torch.log_softmax(logits[:, -1], dim=-1, dtype=torch.float32)

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        self.cache.reorder(rows, sentences, beam)


# The model to decode with in a precision: a copy with its weights cast or quantized once, so that
# no step casts them again. Callers that decode many times with the same weights make it once.
decoding_model = kernels.inference_copy


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
    decode = dataclasses.replace(decode, **changes) if changes else decode
    config = model.config
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    decoder = decoding_model(model, decode.precision)
    beam = decode.beam
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * (len(sources[order[end]]) + 1) * beam <= decode.batch_tokens:
            end += 1
        chunk = order[start:end]
        longest = max(len(sources[i]) + 1 for i in chunk)
        src = torch.full((len(chunk), longest), config.pad_id, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids = list(sources[i]) + [config.eos_id]
            src[row, : len(ids)] = torch.tensor(ids)
        max_len = torch.tensor([len(sources[i]) + decode.extra_len for i in chunk])
        if decode.max_output_len is not None:
            max_len = max_len.clamp(max=decode.max_output_len)
        if config.positional == "learned":  # the search may feed one position past the limit
            max_len = max_len.clamp(max=config.max_len - 1)
        with torch.inference_mode():
            stepper = ModelStep(decoder, src.to(device), int(max_len.max()) + 1, beam)
            max_len = max_len.to(device)  # the search keeps its state where the model is
            guards = dict(no_repeat_ngram=decode.no_repeat_ngram_size, repetition_penalty=decode.repetition_penalty)
            if beam == 1:
                outputs = greedy(stepper.step, stepper.reorder, config.bos_id, config.eos_id, max_len, decode.min_len,
                                 **guards)
            else:
                hypotheses = beam_search(stepper.step, stepper.reorder, config.bos_id, config.eos_id, max_len,
                                         beam, decode.alpha, decode.min_len, **guards)
                outputs = [h.tokens for h in hypotheses]
        for i, out in zip(chunk, outputs):
            results[i] = out
        if progress is not None:
            progress.update(len(chunk))
        start = end
    model.train(was_training)
    return results


def translate_texts(model: Transformer, tokenizer, sentences: Sequence[str], **options) -> list[str]:
    """Detokenized translations of `sentences`, in order (options as `translate_ids`)."""
    outputs = translate_ids(model, tokenizer.encode_batch(list(sentences)), **options)
    return [tokenizer.decode(ids) for ids in outputs]


def input_token_limit(config, max_input_tokens: int) -> int:
    """The longest source a model takes: `max_input_tokens`, and for learned positions (Table 3
    row E) no more than source + EOS fit in `max_len`."""
    if config.positional == "learned":
        return min(max_input_tokens, config.max_len - 1)
    return max_input_tokens


# Lines read, decoded and written together: enough to fill length-sorted batches, few enough that
# memory does not grow with the file and an interruption loses little.
CHUNK_LINES = 1000


def translate_stream(
    model: Transformer,
    tokenizer,
    lines: Iterable[str],
    write: Callable[[list[str]], None],
    *,
    max_input_tokens: int = 1024,
    finish: Callable[[str, str], str] = lambda line, output: output,
    chunk_lines: int = CHUNK_LINES,
    note: Callable[[str], None] = lambda _: None,
    first_line: int = 1,
    progress: Optional[object] = None,
    decode: DecodeConfig = DECODE_PRESETS["translate"],
    **changes,
) -> int:
    """Decode one sentence a line, `chunk_lines` lines at a time, handing each chunk's outputs to
    `write` in input order as soon as the chunk is done; returns the number of lines.

    An empty line gives an empty line. A line longer than `max_input_tokens` tokens (or than a
    learned-position model's `max_len` allows) is cut to fit, with a `note`. `finish(line,
    output)` turns a decoded output into the line written (the parser builds a tree there); a
    line break the model spells becomes a space, so the output keeps one line per input line.
    `decode` and `changes` are those of `translate_ids`.
    """
    decode = dataclasses.replace(decode, **changes) if changes else decode
    limit = input_token_limit(model.config, max_input_tokens)
    decoder = decoding_model(model, decode.precision)  # cast once, not per chunk
    count = 0
    chunk: list[str] = []

    def flush() -> None:
        sources, where = [], []
        for offset, line in enumerate(chunk):
            if not line.strip():
                continue
            ids = tokenizer.encode(line.strip())
            if len(ids) > limit:
                note(f"line {first_line + count + offset} has {len(ids)} tokens; using its first {limit}")
                ids = ids[:limit]
            sources.append(ids)
            where.append(offset)
        outputs = translate_ids(decoder, sources, decode, progress=progress)
        if progress is not None:
            progress.update(len(chunk) - len(sources))  # the empty lines
        decoded = [""] * len(chunk)
        for offset, ids in zip(where, outputs):
            decoded[offset] = " ".join(tokenizer.decode(ids).splitlines())
        write([finish(line, out) if line.strip() else "" for line, out in zip(chunk, decoded)])

    for line in lines:
        chunk.append(line)
        if len(chunk) == chunk_lines:
            flush()
            count += len(chunk)
            chunk = []
    if chunk:
        flush()
        count += len(chunk)
    return count
