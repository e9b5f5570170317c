"""Scoring translations (§6.1): sacreBLEU, the reproducible standard, with its signature; and the
paper's own protocol (tokenized BLEU with compound splitting), to compare with Table 2."""

from __future__ import annotations

import re
from typing import Sequence


def _corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]):
    """sacreBLEU's corpus score with its defaults (13a tokenization, exp smoothing), and the metric."""
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU()
    return metric.corpus_score(list(hypotheses), [list(references)]), metric


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus BLEU of detokenized text with sacreBLEU's defaults (13a tokenization, exp
    smoothing). Returns (score, signature); the signature says exactly how it was computed."""
    score, metric = _corpus_bleu(hypotheses, references)
    return score.score, str(metric.get_signature())


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Hypothesis length over reference length, in sacreBLEU's 13a tokens summed over the corpus
    (the ratio behind BLEU's brevity penalty): far above 1, outputs run on; below 1, they stop short."""
    score, _ = _corpus_bleu(hypotheses, references)
    return score.sys_len / max(score.ref_len, 1)


def repetition_rate(hypotheses: Sequence[str], n: int = 4) -> float:
    """The share of the outputs' word n-grams that repeat an n-gram seen earlier in the same
    sentence: 0 for text that never repeats itself, near 1 for a decoder that loops ("the land of
    the land of the land of ..."). Counted over the corpus, on whitespace-split words."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    total = repeated = 0
    for hypothesis in hypotheses:
        words = hypothesis.split()
        seen: set[tuple[str, ...]] = set()
        for i in range(len(words) - n + 1):
            gram = tuple(words[i : i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / total if total else 0.0


def split_compounds(tokenized: str) -> str:
    """The paper's compound splitting (tensor2tensor's get_ende_bleu.sh): a hyphen between two
    non-space characters becomes a token of its own, "a-b" -> "a ##AT##-##AT## b"."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokenized)


def check_moses_language(lang: str) -> None:
    """A language the Moses tokenizer has rules for; any other would silently get none."""
    from sacremoses.corpus import NonbreakingPrefixes

    known = sorted(set(NonbreakingPrefixes().available_langs.values()))
    if lang not in known:
        raise ValueError(f"the Moses tokenizer has no rules for {lang!r}; it knows {', '.join(known)}")


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str = "en") -> float:
    """BLEU as Table 2 was computed: Moses-tokenized text, compounds split, then BLEU on those
    tokens with no further tokenization and no smoothing (multi-bleu.perl). Scores from it are
    comparable with the paper's, not with sacreBLEU's."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesTokenizer

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    check_moses_language(lang)
    tokenizer = MosesTokenizer(lang=lang)
    prepare = lambda text: split_compounds(tokenizer.tokenize(text, escape=False, return_str=True))  # noqa: E731
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]]).score
