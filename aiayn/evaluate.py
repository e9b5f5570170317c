"""Scoring translations (§6.1): sacreBLEU, the reproducible standard, with its signature; and the
paper's own protocol (tokenized BLEU with compound splitting), to compare with Table 2."""

from __future__ import annotations

import re
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
