"""Which sentence splitter aiayn uses for paragraphs, chosen by measurement.

Paragraphs are made of consecutive verses of bible-en-es's test books, 3 to 8 at a time (drawn
with a fixed seed), their references joined the same way. A model trained on verses is then asked
to translate each paragraph:

    whole        the paragraph as one sequence (what a server without splitting does)
    SPLITTER     the paragraph cut into sentences by SPLITTER (pysbd, sentencex, blingfire, ...),
                 the sentences translated as one batch and joined with the paragraph's own spaces
    verses       each verse on its own, joined (the best a splitter can hope for: the model's units)

and scored with sacreBLEU against the joined references. The splitters' time per paragraph is
measured too (the median of 5 passes over all paragraphs). Writes results/sentence-split-KIND.json.

    .venv/bin/python benchmarks/sentence_split.py runs/demo60/averaged --paragraphs 200
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time
from pathlib import Path

import torch

from aiayn.corpora import load_corpus
from aiayn.device import cpu_kind
from aiayn.evaluate import score_hypotheses
from aiayn.sentences import interleave, spans_from_strings
from aiayn.translate import Translator
from common import command_line, default_threads, machine, or_exit, parse_args, positive_int, write_results

HERE = Path(__file__).resolve().parent


def splitters(lang: str) -> dict:
    """name -> text -> spans, for every candidate library installed here."""
    found = {}
    try:
        pysbd = importlib.import_module("pysbd")
        segmenter = pysbd.Segmenter(language=lang, clean=False)
        found["pysbd"] = lambda text: spans_from_strings(text, segmenter.segment(text))
    except ImportError:
        pass
    try:
        sentencex = importlib.import_module("sentencex")
        found["sentencex"] = lambda text: spans_from_strings(text, sentencex.segment(lang, text))
    except ImportError:
        pass
    try:
        blingfire = importlib.import_module("blingfire")
        found["blingfire"] = lambda text: [tuple(o) for o in blingfire.text_to_sentences_and_offsets(text)[1]]
    except ImportError:
        pass
    return found


def paragraphs(pairs: list[tuple[str, str]], count: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """Consecutive verses, 3 to 8 at a time, `count` paragraphs from the start of the test books."""
    draw, out, at = random.Random(seed), [], 0
    while len(out) < count and at < len(pairs):
        size = draw.randint(3, 8)
        out.append(pairs[at: at + size])
        at += size
    return out


def translate_split(translator: Translator, texts: list[str], split) -> list[str]:
    """Each text cut by `split` into pieces, every piece of every text in one batch, joined back
    with the text's own characters between the pieces."""
    cuts = [split(text) for text in texts]
    pieces = [text[a:b] for text, spans in zip(texts, cuts) for a, b in spans]
    translated = iter(translator.translate(pieces))
    out = []
    for text, spans in zip(texts, cuts):
        ends = [0] + [b for _, b in spans]
        rest = [text[end:a] for end, (a, _) in zip(ends, spans)] + [text[ends[-1]:]]
        out.append(interleave([next(translated) for _ in spans], rest))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model or run folder trained on bible-en-es")
    parser.add_argument("--paragraphs", type=positive_int, default=200)
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--out", type=Path, help="default results/sentence-split-KIND.json")
    args = parse_args(parser, inputs=lambda args: [args.model])
    torch.set_num_threads(args.threads)
    corpus = load_corpus("bible-en-es")
    groups = paragraphs(corpus.splits["test"], args.paragraphs)
    texts = [" ".join(s for s, _ in group) for group in groups]
    references = [" ".join(t for _, t in group) for group in groups]
    translator = or_exit(lambda: Translator.load(args.model, "cpu"))
    found = splitters(corpus.src_lang)
    rows = {}
    for name, split in found.items():
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            cuts = [split(text) for text in texts]
            seconds.append(time.perf_counter() - start)
        rows[name] = {"split_ms_per_paragraph": round(1000 * statistics.median(seconds) / len(texts), 3),
                      "pieces_per_paragraph": round(sum(map(len, cuts)) / len(texts), 2)}
    verse_spans = []
    for group, text in zip(groups, texts):
        spans, at = [], 0
        for source, _ in group:
            spans.append((at, at + len(source)))
            at += len(source) + 1
        verse_spans.append(spans)
    by_text = dict(zip(texts, verse_spans))
    candidates = {"whole": lambda text: [(0, len(text))], **found, "verses": lambda text: by_text[text]}
    for name, split in candidates.items():
        start = time.perf_counter()
        hypotheses = translate_split(translator, texts, split)
        result = score_hypotheses(hypotheses, references, time.perf_counter() - start)
        rows.setdefault(name, {}).update(result.to_dict())
        print(f"{name}: BLEU {result.bleu:.2f}, length ratio {result.length_ratio:.3f}, "
              f"{rows[name].get('split_ms_per_paragraph', 0):.3f} ms a paragraph to split", flush=True)
    results = {"benchmark": "sentence-split", "command": command_line(), "cpu_kind": cpu_kind(),
               "machine": machine(torch.device("cpu"), args.threads), "model": args.model,
               "paragraphs": len(texts), "verses": sum(map(len, groups)), "decode": "§6.1: beam 4, α 0.6, fp32",
               "rows": rows}
    write_results(args.out or HERE / "results" / f"sentence-split-{cpu_kind()}.json", results)


if __name__ == "__main__":
    main()
