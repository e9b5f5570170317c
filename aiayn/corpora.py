"""Parallel corpora: where the sentence pairs of §5.1 come from.

Corpora come from four places, all turned into a `ParallelCorpus` of (source, target) pairs:
the built-in `bible-en-es` (shipped inside the package, no network), two aligned plain-text
files per split, a two-column TSV, and WMT14 through Hugging Face `datasets` (optional extra).
Batching them is aiayn.batching's job; encoding them once for training, aiayn.store's.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from aiayn.config import is_language_code
from aiayn.files import atomic_write, output_lock, refuse_to_replace
from aiayn.lines import Pair, aligned_pairs, read_lines, tsv_pairs, visible

CORPORA_DIR = Path(__file__).parent / "corpora"
BIBLE_FILE = "bible-en-es.tsv.xz"
_BIBLE = {"bible-en-es": ("en", "es"), "bible-es-en": ("es", "en")}
# The file at the top of a DATA_DIR that aiayn.store writes: named here, below the store, so that
# a corpus given as a folder can be told from one already encoded.
STORE_MANIFEST = "manifest.json"
# The sides of a TSV corpus whose languages were not given: names of columns, not languages.
UNNAMED = ("src", "tgt")
_WMT14 = {f"wmt14-{a}-{b}": (a, b) for a, b in [("de", "en"), ("en", "de"), ("fr", "en"), ("en", "fr")]}
# Other names the splits go by in downloaded corpora (fairseq's "valid", HF's "validation").
_SPLIT_ALIASES = {"train": ("train",), "dev": ("dev", "valid", "validation"), "test": ("test",)}
_SHARD = re.compile(r".+-(\d+)-of-(\d+)\.parquet")  # a shard as the HF hub names it: train-00000-of-00003.parquet

# ISO 639-1 names of the languages a model here is likely to translate (LibreTranslate's names).
LANGUAGE_NAMES = {  # the languages LibreTranslate's Argos packages cover, and a few more
    "ar": "Arabic", "az": "Azerbaijani", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech",
    "da": "Danish", "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish",
    "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish",
    "gl": "Galician", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay", "nb": "Norwegian Bokmål",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sq": "Albanian", "sv": "Swedish", "th": "Thai", "tl": "Tagalog", "tr": "Turkish",
    "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese",
    "pb": "Portuguese (Brazil)", "zt": "Chinese (traditional)",  # Argos's codes of pt-BR and zh-Hant (config.argos_code)
}


def language_name(code: str) -> str:
    """A language's English name; with a script or region (pt-BR, zh_Hant), its language's name
    and the code; a code the table lacks, as it is."""
    if code in LANGUAGE_NAMES:
        return LANGUAGE_NAMES[code]
    language = code.replace("_", "-").split("-")[0]
    return f"{LANGUAGE_NAMES[language]} ({code})" if language in LANGUAGE_NAMES else code


@dataclass
class ParallelCorpus:
    """Sentence pairs by split ("train", "dev", "test"; dev and test may be absent).

    On construction each sentence is stripped and any line break inside it becomes a space; a
    pair with an empty side is left out and counted in `dropped[split]`, for the caller to report.
    """

    name: str
    src_lang: str
    tgt_lang: str
    splits: dict[str, list[Pair]]
    dropped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_languages(self.src_lang, self.tgt_lang)
        for split, pairs in list(self.splits.items()):
            self.splits[split], dropped = clean_pairs(pairs)
            self.dropped[split] = self.dropped.get(split, 0) + dropped
        if not self.splits.get("train"):
            raise ValueError(f"corpus {self.name} has no training pairs")

    def stream(self) -> "CorpusStream":
        """This corpus as a `CorpusStream`, its splits served in chunks."""
        splits = {split: (lambda pairs=pairs: _chunked(pairs)) for split, pairs in self.splits.items()}
        return CorpusStream(self.name, self.src_lang, self.tgt_lang, splits, dict(self.dropped))


@dataclass
class CorpusStream:
    """A corpus read a chunk of pairs at a time: `splits[name]()` reads that split from its start
    and yields lists of up to CHUNK_PAIRS raw pairs (to be cleaned with `clean_pairs`), so that
    `aiayn preprocess` reads corpora larger than memory. `load()` reads it whole, as
    `load_corpus` does. `dropped` counts pairs already left out before the chunks."""

    name: str
    src_lang: str
    tgt_lang: str
    splits: dict[str, Callable[[], Iterator[list[Pair]]]]
    dropped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_languages(self.src_lang, self.tgt_lang)
        if "train" not in self.splits:
            raise ValueError(f"corpus {self.name} has no training split")

    def load(self) -> ParallelCorpus:
        splits = {split: [pair for chunk in read() for pair in chunk] for split, read in self.splits.items()}
        return ParallelCorpus(self.name, self.src_lang, self.tgt_lang, splits, dict(self.dropped))


CHUNK_PAIRS = 50_000


def _chunked(pairs: Iterable[Pair]) -> Iterator[list[Pair]]:
    chunk: list[Pair] = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) == CHUNK_PAIRS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _check_languages(src_lang: str, tgt_lang: str) -> None:
    """Two languages that can name files (SPLIT.LANG: found in review, ../x named a path outside
    the folder; aiayn.store refuses the suffixes of its own files)."""
    if src_lang == tgt_lang:
        raise ValueError(f"source and target language are both {src_lang!r}; give two different languages")
    for lang in (src_lang, tgt_lang):
        if not lang or "/" in lang or "\\" in lang or lang.startswith("."):
            raise ValueError(f"{lang!r} cannot name a language's files: give a code such as en or de")


def clean_pairs(pairs: Sequence[Pair]) -> tuple[list[Pair], int]:
    """The pairs with each sentence stripped and its line breaks made spaces, without those with
    an empty side; and how many were left out."""
    kept = [(s, t) for s, t in ((_clean(s), _clean(t)) for s, t in pairs) if s and t]
    return kept, len(pairs) - len(kept)


def _clean(text: str) -> str:
    # A line break inside a sentence would misalign the plain-text files that export_split writes.
    # A side of control or format characters only is empty, as translation reads it (`visible`):
    # trained on, the model would learn to invent a sentence from byte pieces.
    return visible(" ".join(text.strip().splitlines()))


def corpus_names() -> list[str]:
    """The corpora known by name; WMT14 needs the `hf` extra and network."""
    return [*_BIBLE, *_WMT14]


def stream_corpus(spec: str, src_lang: Optional[str] = None, tgt_lang: Optional[str] = None) -> CorpusStream:
    """A corpus by name (see `corpus_names`), or from a folder of aligned files or a .tsv file.

    A folder holds `train.SRC` and `train.TGT` (one sentence per line, aligned by line) and
    optionally `dev.*` and `test.*` alike, or `train.tsv` (+ `dev.tsv`, `test.tsv`) with two
    tab-separated columns, source then target, or WMT14's Parquet files from the Hugging Face
    hub (see `stream_parquet`). A single .tsv or .parquet file is the train split.
    Treebanks (§6.3): a `.mrg` file is the train split, a folder with `train.mrg` (+ `dev.mrg`,
    `test.mrg`) gives each split; pairs are (words, linearized tree), see aiayn.parsing.
    Files are read chunk by chunk, when a split is read (`load_corpus` reads them all at once).
    """
    named = {**_BIBLE, **_WMT14}
    if spec in named:
        src, tgt = named[spec]
        given = (src_lang or src, tgt_lang or tgt)
        if given != (src, tgt):
            reverse = f"{spec.split('-')[0]}-{tgt}-{src}"
            lacks = [lang for lang in given if lang not in (src, tgt)]
            if not lacks:  # its own languages, the other way round (one flag or both)
                raise ValueError(f"{spec} translates {src} to {tgt}; the reverse direction is {reverse}")
            # (found in review: --src-lang de was told of the reverse direction, which has no de either)
            raise ValueError(f"{spec} translates {src} to {tgt} (and {reverse} {tgt} to {src}); it has no "
                             f"{' or '.join(lacks)} text (codes are lower case)")
        if spec in _BIBLE:
            path = CORPORA_DIR / BIBLE_FILE
            if not path.is_file():
                raise FileNotFoundError(f"the built-in corpus file {path} is missing from this installation")
            return read_table(path, src, tgt, name=spec).stream()
        pair = "-".join(sorted((src, tgt), key=lambda lang: lang == "en"))  # HF configs: "de-en", "fr-en"
        return stream_hf_translation("wmt/wmt14", pair, src, tgt, name=spec)
    path = Path(spec)
    if (path.is_file() and path.suffix == ".mrg") or (path / "train.mrg").is_file():
        # §6.3: a treebank, as pairs of sentence -> linearized tree
        from aiayn.parsing import load_treebank_pairs

        files = {"train": path} if path.is_file() else {s: path / f"{s}.mrg" for s in ("train", "dev", "test")}
        splits = {split: load_treebank_pairs(file) for split, file in files.items() if file.is_file()}
        return ParallelCorpus(path.stem, "words", "tree", splits).stream()
    if path.is_dir():  # one kind of corpus a folder (found by fault hunts: the Parquet, or the TSV, was taken unsaid)
        tsv = _split_file(path, "train.tsv")
        kinds = [names for names in (sorted(p.name for p in path.glob("train*.parquet"))[:1], [tsv.name] if tsv else [],
                                     sorted(p.name for p in path.glob("train.*") if _language_suffix(p.name[6:]))) if names]
        if len(kinds) > 1:
            raise ValueError(f"{path} holds {', '.join(kinds[0])} and {', '.join(sum(kinds[1:], []))}: which is the corpus? Give one kind")
    if (path.is_file() and path.suffix == ".parquet") or (path.is_dir() and any(path.glob("train*.parquet"))):
        return stream_parquet(path, src_lang, tgt_lang)
    if path.is_dir():
        if held := [f"{split}.mrg" for split in ("dev", "test") if (path / f"{split}.mrg").is_file()]:  # (found by a misuse hunt)
            raise ValueError(f"{path} holds {' and '.join(held)} but no train.mrg, which a treebank folder needs; one .mrg file is "
                             f"read as a train split: aiayn corpus export {path / held[-1]} --split train --out DIR writes its sentences")
        if (path / STORE_MANIFEST).is_file():  # (found in review: "cannot tell the languages", of train.bin and train.idx.npy)
            raise ValueError(f"{path} is a corpus aiayn preprocess has encoded already: train on it with --data {path}")
        if _split_file(path, "train.tsv"):
            return _tsv_folder_stream(path, *_tsv_languages(src_lang, tgt_lang))
        return _text_folder_stream(path, src_lang, tgt_lang)
    if path.is_file() and path.name.endswith((".tsv", ".tsv.xz")):
        return CorpusStream(path.name.split(".")[0], *_tsv_languages(src_lang, tgt_lang), {"train": lambda: _chunked(tsv_pairs(path))})
    if not path.exists() and (path.suffix or len(path.parts) > 1):  # a path, not a mistyped name
        raise FileNotFoundError(f"no such corpus file or folder: {spec}")
    gzip = " (gzip is not read: decompress it, or compress it with xz)" if path.suffix == ".gz" else ""  # (a misuse hunt)
    raise ValueError(f"unknown corpus {spec!r}: not a built-in name ({', '.join(corpus_names())}) nor a folder, .tsv, .parquet or .mrg file{gzip}")


def _tsv_languages(src_lang: Optional[str], tgt_lang: Optional[str]) -> tuple[str, str]:
    """The languages of TSV columns, which name none: both given, or neither (src and tgt).
    Found by a misuse hunt: --src-lang alone named the other column `tgt` without a word."""
    if (src_lang is None) != (tgt_lang is None):
        given, missing = ("--src-lang", "--tgt-lang") if tgt_lang is None else ("--tgt-lang", "--src-lang")
        raise ValueError(f"a TSV corpus names no languages: with {given}, give {missing} too (or neither, "
                         f"for {UNNAMED[0]} and {UNNAMED[1]})")
    return (src_lang, tgt_lang) if src_lang else UNNAMED


def load_corpus(spec: str, src_lang: Optional[str] = None, tgt_lang: Optional[str] = None) -> ParallelCorpus:
    """The corpus `stream_corpus(spec, ...)` names, read whole into memory."""
    return stream_corpus(spec, src_lang, tgt_lang).load()


# --------------------------------------------------------------------------------------------
# Readers


def read_table(path: Union[str, Path], src_lang: str, tgt_lang: str, name: Optional[str] = None) -> ParallelCorpus:
    """A corpus from one TSV with a header naming its columns, one of them `split`.

    This is the format of the built-in corpus: `split  ref  en  es`, one line per verse.
    """
    header, *rows = read_lines(path)
    columns = header.split("\t")
    for column in ("split", src_lang, tgt_lang):
        if column not in columns:
            raise ValueError(f"{path}: no column {column!r} in the header {columns}")
    i_split, i_src, i_tgt = columns.index("split"), columns.index(src_lang), columns.index(tgt_lang)
    splits: dict[str, list[Pair]] = {}
    for number, line in enumerate(rows, start=2):
        values = line.split("\t")
        if len(values) != len(columns):
            raise ValueError(f"{path}, line {number}: expected {len(columns)} tab-separated columns, found {len(values)}")
        splits.setdefault(values[i_split], []).append((values[i_src], values[i_tgt]))
    return ParallelCorpus(name or Path(path).name.split(".")[0], src_lang, tgt_lang, splits)


# Suffixes that name no language beside a train.tsv: a script, a log, notes.
_FILE_SUFFIXES = frozenset({"tsv", "txt", "log", "py", "sh", "md", "json", "csv", "yml", "yaml", "cfg", "ini", "out",
                            "err", "bak", "old", "tmp", "pkl", "bin"})


def _language_suffix(suffix: str) -> bool:
    """Whether a train.SUFFIX file may be one side of a text corpus (train.en, train.pt-BR.xz)."""
    return is_language_code(suffix := suffix.removesuffix(".xz")) and suffix.lower() not in _FILE_SUFFIXES


def _split_file(folder: Path, name: str) -> Optional[Path]:
    """folder/name, or folder/name.xz (found in review: a folder of train.en.xz was not found);
    both are refused as two versions of one file."""
    found = [path for path in (folder / name, folder / f"{name}.xz") if path.is_file()]
    if len(found) == 2:
        raise ValueError(f"{folder} holds {name} and {name}.xz: which is the corpus? Keep one")
    return found[0] if found else None


def _find_split(folder: Path, split: str, *suffixes: str) -> Optional[list[Path]]:
    """`split`'s files under its first name with all `suffixes` (dev.en never pairs with valid.es)."""
    for alias in _SPLIT_ALIASES[split]:
        paths = [_split_file(folder, f"{alias}.{suffix}") for suffix in suffixes]
        if None not in paths:
            return paths
    return None


def _tsv_folder_stream(folder: Path, src_lang: str, tgt_lang: str) -> CorpusStream:
    splits = {}
    for split in _SPLIT_ALIASES:
        if found := _find_split(folder, split, "tsv"):
            splits[split] = lambda path=found[0]: _chunked(tsv_pairs(path))
    return CorpusStream(folder.resolve().name, src_lang, tgt_lang, splits)


def _text_folder_stream(folder: Path, src_lang: Optional[str], tgt_lang: Optional[str]) -> CorpusStream:
    """A corpus from `train.SRC` + `train.TGT` (and optional `dev.*`, `test.*`) in `folder`.

    Missing languages are inferred: one given, the other is the remaining suffix of the train
    files; none given, the folder name says the direction (`.../de-en` means de to en)."""
    found = sorted({p.name[len("train."):].removesuffix(".xz") for p in folder.glob("train.*")} - {"tsv"})
    if gz := [name for name in found if name.endswith(".gz")]:  # (found by a misuse hunt: "cannot tell the languages")
        raise ValueError(f"{folder} holds train.{', train.'.join(gz)}: gzip is not read; decompress them, or compress them with xz")
    if len(found) < 2:  # a dataset from the HF hub keeps its Parquet files a folder down (data/, de-en/)
        nested = ", ".join(sorted({str(p.parent) for p in folder.glob("*/train*.parquet")}))
        raise FileNotFoundError(f"{folder} holds no train.SRC and train.TGT pair of files (nor a train.tsv)"
                                + (f"; Parquet splits are in {nested}: give that folder" if nested else ""))
    if src_lang is None or tgt_lang is None:
        src_lang, tgt_lang = _infer_languages(folder, found, src_lang, tgt_lang)
    splits = {}
    for split in _SPLIT_ALIASES:
        src_path, tgt_path = _find_split(folder, split, src_lang, tgt_lang) or \
            [(_find_split(folder, split, lang) or [None])[0] for lang in (src_lang, tgt_lang)]
        if split == "train" and (src_path is None or tgt_path is None):
            missing = f"train.{src_lang}" if src_path is None else f"train.{tgt_lang}"
            raise FileNotFoundError(f"no {missing} in {folder} (found train.{', train.'.join(found)})")
        if src_path is None and tgt_path is None:
            continue
        if src_path is None or tgt_path is None:
            raise FileNotFoundError(f"{src_path or tgt_path} has no counterpart in the other language in {folder}")
        splits[split] = lambda a=src_path, b=tgt_path: _chunked(aligned_pairs(a, b))
    return CorpusStream(folder.resolve().name, src_lang, tgt_lang, splits)


def _infer_languages(folder: Path, found: list[str], src: Optional[str], tgt: Optional[str]) -> tuple[str, str]:
    if src is not None or tgt is not None:
        others = [lang for lang in found if lang not in (src, tgt)]
        if len(others) == 1:
            return (src, others[0]) if src is not None else (others[0], tgt)
    elif len(found) == 2:
        direction = re.fullmatch(r"(\w+)-(\w+)", folder.resolve().name.split(".")[-1])
        if direction and sorted(direction.groups()) == found:
            return direction.group(1), direction.group(2)
    raise ValueError(f"cannot tell the languages of {folder} (train files: {', '.join(found)}); "
                     "give the source and target languages (--src-lang, --tgt-lang)")


# --------------------------------------------------------------------------------------------
# Hugging Face datasets (the `hf` extra)


def stream_hf_translation(path_or_name: str, config: Optional[str], src_lang: Optional[str], tgt_lang: Optional[str],
                          data_files: Optional[dict] = None, name: Optional[str] = None,
                          cache_dir: Optional[str] = None) -> CorpusStream:
    """A corpus from a HF dataset whose rows are `{"translation": {src_lang: ..., tgt_lang: ...}}`,
    as WMT14's: `stream_hf_translation("wmt/wmt14", "de-en", "en", "de")` downloads it. With
    `data_files`, local files of that format: `stream_hf_translation("parquet", None, ...,
    data_files={"train": "train.parquet"})`. Splits train, validation (-> dev) and test. The
    dataset stays in its memory-mapped Arrow files and becomes strings one Arrow chunk at a
    time; `.load()` reads it whole."""
    try:
        import datasets
    except ImportError as error:  # its own, or a package of its that fails to load: said (found by a fault hunt)
        raise ImportError(f"loading this corpus needs Hugging Face datasets ({error}): install the hf extra: pip install 'aiayn[hf]'") from None
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retries, a line each, before the one error
    try:
        loaded = datasets.load_dataset(path_or_name, config, data_files=data_files, cache_dir=cache_dir)
    except ConnectionError as error:  # (found in a docs audit: 25 s of retry lines, then no way out named)
        raise ConnectionError(f"{' '.join(str(error).split())}; without a network, give the Parquet files of "
                              "the hub, copied here, as a folder: --corpus FOLDER --src-lang en --tgt-lang de") from None
    finally:
        hub_log.setLevel(level)
    found = {split: next((a for a in _SPLIT_ALIASES[split] if a in loaded), None) for split in _SPLIT_ALIASES}
    if not found["train"]:
        raise ValueError(f"{path_or_name} has no train split (its splits: {', '.join(loaded)})")
    for hf_split in filter(None, found.values()):  # rows of another shape (found in review: a KeyError)
        if "translation" not in loaded[hf_split].column_names:
            raise ValueError(f"the {hf_split} split of {path_or_name} has no 'translation' column (its columns: "
                             f"{', '.join(loaded[hf_split].column_names)})")
    columns = {split: loaded[hf_split].data.column("translation") for split, hf_split in found.items() if hf_split}
    arrays = {split: (lambda column=column: iter(column.chunks)) for split, column in columns.items()}
    types = {split: column.type for split, column in columns.items()}
    return _translation_stream(name or path_or_name.split("/")[-1], arrays, types, src_lang, tgt_lang)


def stream_parquet(path: Union[str, Path], src_lang: Optional[str] = None, tgt_lang: Optional[str] = None) -> CorpusStream:
    """A corpus from local Parquet files in the layout of WMT14 on the Hugging Face hub: rows of
    `{"translation": {"de": ..., "en": ...}}` in `train-00000-of-00003.parquet`, ...,
    `validation-*.parquet`, `test-*.parquet` (a folder), or one .parquet file (the train split).
    Read with pyarrow batch by batch, without a copy into the HF cache. Both languages must be
    given unless the files hold only two and one is given."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"reading Parquet corpora needs pyarrow ({error}): pip install 'aiayn[hf]'") from None
    path = Path(path)
    files: dict[str, list[Path]] = {}
    for file in [path] if path.is_file() else sorted(path.glob("*.parquet")):
        prefix = re.split(r"[-._]", file.name, maxsplit=1)[0]
        split = "train" if path.is_file() else next((s for s, names in _SPLIT_ALIASES.items() if prefix in names), None)
        if split is not None:
            files.setdefault(split, []).append(file)
            # dev-* and validation-* name one split: which? (found by a misuse hunt: merged)
            if len(names := {re.split(r"[-._]", f.name, maxsplit=1)[0] for f in files[split]}) > 1:
                raise ValueError(f"{path} holds {' and '.join(sorted(names))} files: which is its {split} split? Keep one name")
    if "train" not in files:  # named by the word before the first - . or _ (found in review: training-0.parquet)
        found = ", ".join(file.name for file in sorted(path.glob("*.parquet"))[:3]) if path.is_dir() else ""
        raise FileNotFoundError(f"{path} holds no train.parquet or train-*.parquet file (the splits' files begin with "
                                f"train, validation or dev, and test){f'; it has {found}' if found else ''}")
    for split, paths in files.items() if path.is_dir() else ():  # each shard once, all (found by a fault hunt: 2 of 3 read)
        cut = sorted((int(m[1]), int(m[2])) if (m := _SHARD.fullmatch(file.name)) else (-1, 0) for file in paths)
        if (count := max(total for _, total in cut)) and cut != [(i, count) for i in range(count)]:
            raise ValueError(f"{path} holds {len(cut)} {split} files where their names count {count} shards: a download or "
                             "copy cut short, or two of them? Keep each shard once, all of them")

    def opened(file: Path):
        try:
            parquet = pq.ParquetFile(file)
        except (OSError, pa.ArrowException) as error:  # not Parquet, cut short, unreadable
            raise ValueError(f"{file} cannot be read as Parquet: {error}") from None
        if (count := parquet.schema_arrow.names.count("translation")) != 1:  # (two were a KeyError: found in review)
            names = ", ".join(parquet.schema_arrow.names)
            raise ValueError(f"{file} has {count or 'no'} 'translation' columns (its columns: {names})")
        return parquet

    def batches(paths: list[Path]) -> Iterator:
        for file in paths:
            try:
                for batch in opened(file).iter_batches(columns=["translation"]):
                    yield batch.column("translation")
            except (OSError, pa.ArrowException) as error:
                raise ValueError(f"{file} cannot be read as Parquet: {error}") from None

    types = {}
    for split, paths in files.items():
        kinds = [opened(file).schema_arrow.field("translation").type for file in paths]
        if any(kind != kinds[0] for kind in kinds):
            raise ValueError(f"the {split} files of {path} disagree in their translation column: "
                             f"{', '.join(sorted({str(kind) for kind in kinds}))}")
        types[split] = kinds[0]
    arrays = {split: (lambda paths=paths: batches(paths)) for split, paths in files.items()}
    return _translation_stream(path.resolve().name, arrays, types, src_lang, tgt_lang)


def _translation_stream(name: str, arrays: dict, types: dict, src_lang: Optional[str], tgt_lang: Optional[str]) -> CorpusStream:
    """A corpus from Arrow arrays of the `translation` struct (`arrays[split]()` yields them, of type
    `types[split]`), all splits of the same languages; a direction is completed where there are two."""
    import pyarrow  # (present: the caller read Arrow data)

    languages = {}
    for split, kind in types.items():
        if not pyarrow.types.is_struct(kind):  # a list has fields too (found in review)
            raise ValueError(f"the translation column of the {split} split is not a struct of languages")
        languages[split] = sorted(kind.field(i).name for i in range(kind.num_fields))
        if twice := sorted({lang for lang in languages[split] if languages[split].count(lang) > 1}):  # (a KeyError)
            raise ValueError(f"the translation column of the {split} split has {', '.join(twice)} twice")
    train_languages = languages.get("train", [])
    for split, found in languages.items():
        if found != train_languages:
            raise ValueError(f"the splits disagree in language: train has {', '.join(train_languages)} "
                             f"but {split} has {', '.join(found)}")
    if src_lang is None or tgt_lang is None:
        others = [lang for lang in train_languages if lang not in (src_lang, tgt_lang)]
        if (src_lang is None) == (tgt_lang is None) or len(others) != 1:
            raise ValueError(f"give the direction with --src-lang and --tgt-lang (the languages of {name} are "
                             f"{', '.join(train_languages)})")
        src_lang, tgt_lang = (src_lang, others[0]) if src_lang is not None else (others[0], tgt_lang)
    for lang in (src_lang, tgt_lang):
        if lang not in train_languages:
            raise ValueError(f"{name} has no {lang!r} side; its languages are {', '.join(train_languages)}")
        for split, kind in types.items():
            found = kind.field(lang).type
            # Text, or dictionary-encoded text (pandas' categories; found in review: refused)
            values = found.value_type if pyarrow.types.is_dictionary(found) else found
            if not (pyarrow.types.is_string(values) or pyarrow.types.is_large_string(values)):
                raise ValueError(f"the {lang!r} values of the {split} split of {name} are {found}, not text")

    def pairs(read) -> Iterator[Pair]:
        # Array by array (row by row, WMT14 en-de's 4.5M rows would take minutes).
        for array in read():
            src, tgt = array.field(src_lang).to_pylist(), array.field(tgt_lang).to_pylist()
            yield from ((s or "", t or "") for s, t in zip(src, tgt))

    splits = {split: (lambda read=read: _chunked(pairs(read))) for split, read in arrays.items()}
    return CorpusStream(name, src_lang, tgt_lang, splits)


def export_split(corpus: CorpusStream, split: str, out_dir: Union[str, Path], force: bool = False, inputs: Sequence = (),
                 note: Callable[[str], None] = lambda _: None, kept: Sequence[Path] = ()) -> tuple[Path, Path]:
    """Write `{split}.{src_lang}` and `{split}.{tgt_lang}`, one sentence per line, into `out_dir`,
    so that any tool can score against the references. Only that split is read, a chunk at a
    time (found in review: exporting test read all of WMT's train into memory first). Existing
    files are replaced only with `force`, and never the corpus's own `inputs` nor what a training
    run `kept` (see `refuse_to_replace`). Pairs with an empty side are not written (as nothing
    trains or scores them): `note` says how many."""
    if split not in corpus.splits:
        raise ValueError(f"corpus {corpus.name} has no {split!r} split (it has {', '.join(corpus.splits)})")
    paths = [Path(out_dir) / f"{split}.{lang}" for lang in (corpus.src_lang, corpus.tgt_lang)]
    for path in paths:
        refuse_to_replace(path, force, inputs, kept=kept)
    dropped = corpus.dropped.get(split, 0)

    def write_both(src_tmp: str, tgt_tmp: str) -> None:
        nonlocal dropped
        written = 0
        with open(src_tmp, "w", encoding="utf-8") as src, open(tgt_tmp, "w", encoding="utf-8") as tgt:
            for chunk in corpus.splits[split]():
                pairs, left_out = clean_pairs(chunk)
                dropped += left_out
                written += len(pairs)
                src.write("".join(source + "\n" for source, _ in pairs))
                tgt.write("".join(target + "\n" for _, target in pairs))
        if not written:
            raise ValueError(f"the {split} split of corpus {corpus.name} has no pair with both sides: nothing to write")

    # Both sides written in full before either is renamed into place, under both outputs' locks:
    # one written and the other not was half a pair, or a new source beside an old reference
    # (an interrupted --force; found in review). The split is read once, into both staged files
    # (each written, synced and renamed by atomic_write).
    staged = [path.with_name(f".{path.name}.{os.getpid()}.pair.tmp") for path in paths]
    with output_lock(paths[0]), output_lock(paths[1]):
        try:
            for path in paths:
                refuse_to_replace(path, force, inputs, kept=kept)  # made meanwhile by a writer that takes no lock
            atomic_write(staged[0], lambda src_tmp: atomic_write(staged[1], lambda tgt_tmp: write_both(src_tmp, tgt_tmp)))
            for stage, path in zip(staged, paths):
                os.replace(stage, path)
        finally:
            for stage in staged:
                stage.unlink(missing_ok=True)
    if dropped:  # the files are shorter than the corpus's own: say so
        note(f"left out {dropped:,} {split} pairs with an empty side")
    return paths[0], paths[1]
