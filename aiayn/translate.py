"""Translating many sentences: length-sorted batches through a search, results in input order;
files streamed through in chunks, so memory stays flat and every finished chunk is written."""

from __future__ import annotations

import copy
from typing import Callable, Iterable, Optional, Sequence

import torch

from aiayn.device import DTYPES, check_precision
from aiayn.model import Transformer
from aiayn.search import ModelStep, beam_search, greedy

EXTRA_LEN = 50  # §6.1: maximum output length = input length + 50


def decoding_model(model: Transformer, precision: str) -> Transformer:
    """The model to decode with: itself in fp32 or when its weights already are in `precision`;
    otherwise a copy with the weights cast once, so that no decoding step casts activations in and
    out of autocast's precision (an autocast step casts the input of every layer). Callers that
    decode many times with the same weights can cast the model once themselves."""
    dtype = DTYPES[precision]
    if precision == "fp32" or next(model.parameters()).dtype == dtype:
        return model
    return copy.deepcopy(model).to(dtype).eval()


def translate_ids(
    model: Transformer,
    sources: Sequence[Sequence[int]],
    beam: int = 1,
    alpha: float = 0.6,
    batch_tokens: int = 4000,
    precision: str = "fp32",
    extra_len: int = EXTRA_LEN,
    min_len: int = 0,
    max_output_len: Optional[int] = None,
    progress: Optional[object] = None,
) -> list[list[int]]:
    """Decode each source (token ids, without EOS) and return the output ids in input order:
    greedy when `beam` is 1, else beam search with the GNMT length penalty α (§6.1: beam 4,
    α = 0.6). The output is at most source length + `extra_len` tokens (and at most
    `max_output_len`, when given) and, unless the limit is shorter, at least `min_len`.

    Sentences are sorted by length and packed up to `batch_tokens` source tokens per batch
    (times the beam), so little compute goes to padding.
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if max_output_len is not None and max_output_len < 1:
        raise ValueError(f"max_output_len must be at least 1, got {max_output_len}")
    config = model.config
    device = next(model.parameters()).device
    check_precision(device, precision)
    was_training = model.training
    model.eval()
    decoder = decoding_model(model, precision)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * (len(sources[order[end]]) + 1) * beam <= batch_tokens:
            end += 1
        chunk = order[start:end]
        longest = max(len(sources[i]) + 1 for i in chunk)
        src = torch.full((len(chunk), longest), config.pad_id, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids = list(sources[i]) + [config.eos_id]
            src[row, : len(ids)] = torch.tensor(ids)
        max_len = torch.tensor([len(sources[i]) + extra_len for i in chunk])
        if max_output_len is not None:
            max_len = max_len.clamp(max=max_output_len)
        if config.positional == "learned":  # the search may feed one position past the limit
            max_len = max_len.clamp(max=config.max_len - 1)
        with torch.no_grad():
            stepper = ModelStep(decoder, src.to(device), int(max_len.max()) + 1)
            if beam == 1:
                outputs = greedy(stepper.step, stepper.reorder, config.bos_id, config.eos_id, max_len, min_len)
            else:
                hypotheses = beam_search(stepper.step, stepper.reorder, config.bos_id, config.eos_id, max_len, beam, alpha, min_len)
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
    **options,
) -> int:
    """Decode one sentence a line, `chunk_lines` lines at a time, handing each chunk's outputs to
    `write` in input order as soon as the chunk is done; returns the number of lines.

    An empty line gives an empty line. A line longer than `max_input_tokens` tokens (or than a
    learned-position model's `max_len` allows) is cut to fit, with a `note`. `finish(line,
    output)` turns a decoded output into the line written (the parser builds a tree there); a
    line break the model spells becomes a space, so the output keeps one line per input line.
    `options` are those of `translate_ids`.
    """
    limit = input_token_limit(model.config, max_input_tokens)
    decoder = decoding_model(model, options.get("precision", "fp32"))  # cast once, not per chunk
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
        outputs = translate_ids(decoder, sources, progress=progress, **options)
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
