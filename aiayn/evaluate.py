"""Scoring translations (§6.1): sacreBLEU, the reproducible standard, with its signature."""

from __future__ import annotations

from typing import Sequence


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus BLEU of detokenized text with sacreBLEU's defaults (13a tokenization, exp
    smoothing). Returns (score, signature); the signature says exactly how it was computed."""
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())
