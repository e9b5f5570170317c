"""Scoring translations (§6.1): sacreBLEU, the reproducible standard, with its signature; and the
paper's own protocol (tokenized BLEU with compound splitting), to compare with Table 2."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from os import PathLike
from typing import Optional, Sequence

from tqdm import tqdm

from aiayn.lines import iter_lines, open_input
from aiayn.parsing import evalb, holds_trees


# Target languages whose words sacreBLEU splits with a tokenizer of their own (tok:zh, ja-mecab,
# ko-mecab): 13a's rules split none of their words, so BLEU on them would count whole sentences.
SACREBLEU_OWN_TOKENIZERS = ("zh", "ja", "ko")
# Other Chinese languages, written in Han characters as zh is: sacreBLEU's zh tokenizer splits
# those (found in review: yue got 13a, which split none, and a BLEU of 0).
HAN_LANGUAGES = ("yue", "cmn", "wuu", "lzh", "hak", "nan", "gan", "hsn")


def sacrebleu_language(lang: Optional[str]) -> str:
    """The target language sacreBLEU is told: the code's language subtag (zh-TW is zh), the
    Chinese languages as zh."""
    if lang is not None and not isinstance(lang, str):  # (found by a misuse hunt: an AttributeError of .lower)
        raise TypeError(f"lang takes a language code (es, de, zh-TW) or None, not {lang!r}")
    code = (lang or "").lower().replace("_", "-").split("-")[0]
    return "zh" if code in HAN_LANGUAGES else code


def bleu_metric(lang: Optional[str] = None):
    """sacreBLEU's BLEU for target language `lang`, as its command line's `-l xx-LANG` makes it:
    13a tokenization but for zh (and the languages `sacrebleu_language` reads as zh), ja and ko
    (None: 13a)."""
    from sacrebleu.metrics import BLEU

    try:
        return BLEU(trg_lang=sacrebleu_language(lang))
    except RuntimeError:  # ja and ko tokenize with MeCab, an extra of sacreBLEU's
        raise ValueError(f"sacreBLEU tokenizes {lang} with MeCab, which is not installed: "
                         f"pip install 'sacrebleu[{lang.lower()}]'") from None


def _corpus_score(metric_name: str, hypotheses: Sequence[str], references: Sequence[str], lang: Optional[str] = None):
    """sacreBLEU's corpus score by its metric `metric_name` ("BLEU", "CHRF") with the metric's
    defaults (BLEU's for target language `lang`), and the metric (for its signature)."""
    import sacrebleu.metrics

    _check_corpus(hypotheses, references)
    metric = bleu_metric(lang) if metric_name == "BLEU" else getattr(sacrebleu.metrics, metric_name)()
    return metric.corpus_score(list(hypotheses), [list(references)]), metric


def _check_corpus(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Two lists of as many sentences, at least one (found in review: two strings were scored
    character by character, and empty lists were an IndexError in sacreBLEU)."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError("hypotheses and references are lists of sentences, not strings: bleu([hyp], [ref]) for one")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    for side, texts in (("hypotheses", hypotheses), ("references", references)):
        if wrong := [text for text in texts if not isinstance(text, str)][:1]:  # (a list was .strip()'s AttributeError)
            raise TypeError(f"{side} are lists of strings, one reference per hypothesis; found a {type(wrong[0]).__name__}: "
                            f"{wrong[0]!r}"[:200])
    if not references:
        raise ValueError("no sentences to score")
    if not any(reference.strip() for reference in references):  # (found in review: BLEU 0, chrF 0 or 100)
        raise ValueError("the references are all blank: no sentences to score")


def bleu(hypotheses: Sequence[str], references: Sequence[str], lang: Optional[str] = None) -> tuple[float, str]:
    """Corpus BLEU of detokenized text with sacreBLEU's defaults (13a tokenization, or the target
    language's own for zh, ja and ko; exp smoothing). Returns (score, signature); the signature
    says exactly how it was computed."""
    score, metric = _corpus_score("BLEU", hypotheses, references, lang)
    return score.score, str(metric.get_signature())


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus chrF with sacreBLEU's defaults (character n-grams up to 6, recall weighted β = 2),
    and its signature: the metric WMT reports beside BLEU, which credits a word form half right
    and is steadier than BLEU on a small test set, where 4-gram matches are few."""
    score, metric = _corpus_score("CHRF", hypotheses, references)
    return score.score, str(metric.get_signature())


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Hypothesis length over reference length, in sacreBLEU's 13a tokens summed over the corpus
    (the ratio behind BLEU's brevity penalty): far above 1, outputs run on; below 1, they stop short."""
    score, _ = _corpus_score("BLEU", hypotheses, references)
    return _ratio(score)


def _ratio(bleu_score) -> float:
    """A sacreBLEU BLEU score's hypothesis over reference length (`length_ratio`)."""
    return bleu_score.sys_len / max(bleu_score.ref_len, 1)


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
    """A language the Moses tokenizer has rules for, and splits into words; any other would
    silently get none (zh: it has rules, but splits no Chinese word, and a sentence was one token:
    found in review)."""
    from sacremoses.corpus import NonbreakingPrefixes

    lang = sacrebleu_language(lang)  # es-ES is es (found in review: refused on the command line)
    if not moses_splits(lang):
        raise ValueError(f"the Moses tokenizer does not split {lang} into words")
    known = sorted(set(NonbreakingPrefixes().available_langs.values()))
    if lang.lower() not in known:
        raise ValueError(f"the Moses tokenizer has no rules for {lang!r}; it knows {', '.join(known)}")


def moses_splits(lang: str) -> bool:
    """Whether Table 2's protocol can score `lang`: not the languages sacreBLEU splits with a
    tokenizer of their own, whose words the Moses tokenizer does not split."""
    return sacrebleu_language(lang) not in SACREBLEU_OWN_TOKENIZERS


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str = "en") -> float:
    """BLEU as Table 2 was computed: Moses-tokenized text, compounds split, then BLEU on those
    tokens with no further tokenization and no smoothing (multi-bleu.perl). Scores from it are
    comparable with the paper's, not with sacreBLEU's."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesTokenizer

    _check_corpus(hypotheses, references)
    lang = sacrebleu_language(lang)  # ES is es, es-ES is es (found in review: refused), as sacreBLEU's language
    check_moses_language(lang)
    tokenizer = MosesTokenizer(lang=lang)
    prepare = lambda text: split_compounds(tokenizer.tokenize(text, escape=False, return_str=True))  # noqa: E731
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score([prepare(h) for h in hypotheses], [[prepare(r) for r in references]]).score


@dataclass
class Score:
    """What `score` measures of a translator on a test set."""

    bleu: float  # sacreBLEU
    signature: str  # how sacreBLEU computed it
    length_ratio: float  # hypothesis over reference length (13a tokens)
    repetition: float  # share of the outputs' word 4-grams that repeat within their sentence
    seconds: float  # decoding time
    paper_bleu: Optional[float] = None  # Table 2's protocol, when the target language is given
    hypotheses: list[str] = field(default_factory=list, repr=False)
    chrf: Optional[float] = None  # sacreBLEU's chrF (its defaults: `chrf`)

    def to_dict(self) -> dict:
        chrf = {"chrf": round(self.chrf, 2)} if self.chrf is not None else {}
        return {"bleu": round(self.bleu, 2), "signature": self.signature, **chrf, "length_ratio": round(self.length_ratio, 3),
                "repetition_4gram": round(self.repetition, 3), "decode_s": round(self.seconds, 1),
                **({"paper_bleu": round(self.paper_bleu, 2)} if self.paper_bleu is not None else {})}


def score(translator, pairs: Sequence[tuple[str, str]], lang: Optional[str] = None, progress: bool = False,
          paper: bool = True, **changes) -> Score:
    """Translate the sources of `pairs` ((source, reference) strings) with `translator`
    (aiayn.translate.Translator; `changes` replace its decoding settings for this call) and score
    the outputs against the references: sacreBLEU's BLEU (tokenized for the target language
    `lang`) and chrF, the length ratio, the repetition rate and the decoding time, and with `lang`
    and `paper` the paper's BLEU.
    The one "translate a split and score it" of the package: the demo, Table 3 and the benchmarks
    call it; training's dev BLEU translates in chunks, to hear a stop signal between them, and
    scores with `score_hypotheses`. `progress`: a progress bar of the sentences translated,
    on a terminal."""
    if not callable(getattr(translator, "translate_ids", None)):  # (found by a misuse hunt: a path was str.translate's TypeError)
        raise TypeError(f"score takes a Translator, not a {type(translator).__name__}"
                        + (f": score(Translator.load({str(translator)!r}), pairs)" if isinstance(translator, (str, PathLike)) else ""))
    pairs = list(pairs)  # a zip or a generator is read twice below
    if any(isinstance(pair, str) or len(pair) != 2 for pair in pairs):  # "ab" was read as ("a", "b")
        raise ValueError("score takes (source, reference) pairs: zip(sources, references)")
    # Before the decoding (found by a misuse hunt: a None reference was an AttributeError after it)
    wrong = next((i for i, pair in enumerate(pairs) if not all(isinstance(text, str) for text in pair)), None)
    if wrong is not None:
        raise TypeError(f"score takes pairs of two strings; pair {wrong} is {pairs[wrong]!r}"[:200])
    if not pairs:
        raise ValueError("no sentences to score")
    bleu_metric(lang)  # a language the scoring refuses is said before the decoding, not after it (found in review)
    if paper and lang and moses_splits(lang):
        check_moses_language(sacrebleu_language(lang))
    start = time.perf_counter()
    with tqdm(total=len(pairs), desc="translate", unit="sentence", disable=not (progress and sys.stderr.isatty())) as bar:
        hypotheses = translator.translate([s for s, _ in pairs], bar, **changes)
    return score_hypotheses(hypotheses, [r for _, r in pairs], time.perf_counter() - start, lang, paper)


def score_hypotheses(hypotheses: Sequence[str], references: Sequence[str], seconds: float = 0.0,
                     lang: Optional[str] = None, paper: bool = True) -> Score:
    """`score`'s measures of outputs made elsewhere (a peer system's, in the benchmarks)."""
    corpus, metric = _corpus_score("BLEU", hypotheses, references, lang)  # once: the score and the lengths
    return Score(corpus.score, str(metric.get_signature()), _ratio(corpus), repetition_rate(hypotheses), seconds,
                 paper_bleu(hypotheses, references, lang) if paper and lang and moses_splits(lang) else None, list(hypotheses),
                 chrf(hypotheses, references)[0])


def _read_lines(path: Optional[str]) -> list[str]:
    """Every line of a small file (or stdin for none), split as `wc -l` counts."""
    handle, name = open_input(path)
    with handle:
        return list(iter_lines(handle, name))


def _read_trees(path: Optional[str]) -> list:
    """The bracketed trees of a file (or stdin for none); a malformed one is named with its file."""
    from aiayn.parsing import read_trees

    text = "\n".join(_read_lines(path))
    try:
        return read_trees(text)
    except ValueError as error:
        # (found in review: corpus export's .tree file, scored as it stands, was "a word beside other elements")
        linearized = "; these are linearized trees, (S (NP XX )NP )S, the parser's targets that `corpus export` " \
            "writes: score the trees `aiayn parse` writes" if re.search(r"\)[^\s()]", text) else ""
        raise ValueError(f"{path or 'stdin'}: {error}{linearized}") from None


def score_files(options, echo=print) -> None:
    """`aiayn score`: sacreBLEU's BLEU and chrF with their signatures, and the paper's BLEU, of a
    hypothesis file against a reference file; with `parse`, EVALB's bracket scores of trees."""
    if options.ref in (None, "-") and options.hyp in (None, "-"):  # the second read found stdin closed (found in review)
        raise ValueError("--ref and --hyp are both stdin: give at least one of them as a file")
    if options.parse:
        gold = _read_trees(options.ref)
        if not gold:  # whatever the hypotheses hold (found in review: their error was said first)
            raise ValueError(f"{options.ref} holds no trees: nothing to score")
        test = _read_trees(options.hyp)
        if len(gold) != len(test):
            raise ValueError(f"{len(test)} test trees but {len(gold)} gold trees")
        result = evalb(gold, test)
        echo(f"bracketing precision {result['precision']:.2f}  recall {result['recall']:.2f}  "
             f"F1 {result['f1']:.2f}  complete match {result['complete_match']:.2f}  "
             f"({len(gold)} sentence{'s' if len(gold) != 1 else ''}; EVALB with COLLINS.prm conventions)")
        return
    moses = moses_splits(options.lang)  # else sacreBLEU scores it; Table 2's protocol has no tokenizer for it
    if moses:  # before reading and scoring, not after
        try:
            check_moses_language(options.lang)
        except ValueError as error:
            raise ValueError(f"--lang {options.lang}: {error}") from None
    bleu_metric(options.lang)  # MeCab missing is said before the files are read
    references = _read_lines(options.ref)
    hypotheses = _read_lines(options.hyp)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypothesis lines but {len(references)} reference lines")
    if not references:
        raise ValueError(f"{options.ref} is empty: no sentences to score")
    if not any(reference.strip() for reference in references):
        raise ValueError(f"{options.ref} holds only blank lines: no sentences to score")
    named = ((options.ref, references), (options.hyp or "stdin", hypotheses))
    treed = [name for name, lines in named if holds_trees(lines[:20])]  # (found by a misuse hunt: a BLEU of trees)
    if len(treed) == 2:
        raise ValueError(f"{options.ref} and {options.hyp or 'stdin'} hold bracketed trees: score them with "
                         "--parse (EVALB's F1), not BLEU")
    if treed:  # one side (found in review: a BLEU of trees against sentences, exit 0)
        raise ValueError(f"{treed[0]} holds bracketed trees and {next(n for n, _ in named if n != treed[0])} does not: "
                         "BLEU compares sentences with sentences, --parse trees with trees")
    value, signature = bleu(hypotheses, references, options.lang)
    echo(f"sacreBLEU       {value:.2f}  {signature}")
    echo("chrF            {:.2f}  {}".format(*chrf(hypotheses, references)))
    if not moses:
        echo(f"paper protocol  -      (the Moses tokenizer does not split {options.lang} into words)")
        return
    echo(f"paper protocol  {paper_bleu(hypotheses, references, options.lang):.2f}  "
         f"(Moses tokenizer -l {sacrebleu_language(options.lang)}, compounds split, multi-bleu: as Table 2; not comparable with sacreBLEU)")
