"""Paragraphs into sentences and back: a model trained on sentences (or verses) translates a
paragraph sentence by sentence, then the translations are put back between the paragraph's own
spaces and line breaks.

The splitter is sentencex (Wikimedia's, rules and abbreviations per language, pure Python),
chosen by measurement (benchmarks/sentence_split.py, docs in the README): on paragraphs of 3-8
test verses of bible-en-es, the 60-minute demo model scored 3.7 BLEU translating each paragraph
whole, 17.7 split by sentencex, 18.5 by blingfire, 17.3 by pysbd, and 18.8 verse by verse (Zen 4,
2026-11-28). blingfire's 0.8 more costs a 99 MB install and splits after abbreviations ("Mr." ends
a sentence); pysbd is 180× slower than sentencex.
"""

from __future__ import annotations

from typing import Sequence


def spans_from_strings(text: str, sentences: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) of each sentence string found in order in `text`, spaces around it left out;
    where a splitter changed the text, what is left is one last piece."""
    spans, at = [], 0
    for sentence in sentences:
        sentence = sentence.strip()
        if not sentence:
            continue
        start = text.find(sentence, at)
        if start < 0:
            break
        spans.append((start, start + len(sentence)))
        at = start + len(sentence)
    rest = text[at:]
    if rest.strip():
        start = at + len(rest) - len(rest.lstrip())
        spans.append((start, at + len(rest.rstrip())))
    return spans


def has_words(text: str) -> bool:
    """Whether `text` holds a letter. A piece without one (a number, a lone "." left between two
    tags, a rule of dashes) has nothing a model could translate, and a model asked to invents
    words: such pieces are kept as they are."""
    return any(character.isalpha() for character in text)


def sentence_spans(text: str, lang: str) -> list[tuple[int, int]]:
    """Where each sentence of `text` starts and ends, by sentencex's rules for `lang`."""
    try:
        from sentencex import segment
    except ImportError as error:
        raise ImportError(f"splitting sentences needs sentencex ({error}): pip install sentencex") from None
    # Every space read as " ", one character for one, so the offsets stay the text's: sentencex's
    # Rust code panics (pyo3's PanicException, past any `except Exception`) on a letter, a space
    # of several UTF-8 bytes (U+00A0, U+2009) and a "." (found in review: the request was a 500).
    plain = "".join(" " if character.isspace() else character for character in text)
    return spans_from_strings(plain, segment(lang, plain))


def split_sentences(text: str, lang: str, lines: bool = True) -> tuple[list[str], list[str]]:
    """(the sentences of `text`, the text around them): `text` is rest[0] + sentences[0] +
    rest[1] + ... + sentences[-1] + rest[-1]. Lines are split first, so a line break always ends
    a sentence and stays where it was; not with `lines` false (HTML's text, where a line break
    is a space). A "sentence" without a letter stays in the text around."""
    sentences, rest, kept = [], [], ""
    for line in text.splitlines(keepends=True) if lines else [text]:
        at = 0
        for start, end in sentence_spans(line, lang):
            if not has_words(line[start:end]):
                continue
            rest.append(kept + line[at:start])
            sentences.append(line[start:end])
            kept, at = "", end
        kept += line[at:]
    rest.append(kept)
    return sentences, rest


def interleave(pieces: Sequence[str], rest: Sequence[str]) -> str:
    """rest[0] + pieces[0] + rest[1] + ... + rest[-1]: a text put back together around new pieces."""
    parts = [rest[0]]
    for piece, after in zip(pieces, rest[1:]):
        parts += [piece, after]
    return "".join(parts)
