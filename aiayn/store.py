"""The preprocessed corpus: token ids on disk, memory-mapped by every process that trains on them.

§5.1 trains on WMT 2014 English-German, "about 4.5 million sentence pairs", with byte-pair
encoding "which has a shared source-target vocabulary of about 37000 tokens". Held as Python
lists of ids, 4.5M pairs take ~20 GB in each process; here they are encoded once
(`aiayn preprocess`) into a folder, DATA_DIR, that holds for each split

    SPLIT.bin        the ids of every pair, source then target, one flat array (uint16 when the
                     vocabulary fits in 16 bits, else uint32), read with numpy.memmap
    SPLIT.idx.npy    int64 (N + 1): where pair i starts in SPLIT.bin; pair i ends where i + 1 starts
    SPLIT.len.npy    int32 (N, 2): source and target length of each pair (no BOS/EOS)

plus `tokenizer.model`, `dev.SRC`/`dev.TGT` and `test.SRC`/`test.TGT` (the text of those splits,
for BLEU and for `aiayn translate`), and `manifest.json` (the corpus, the tokenizer's SHA-256,
counts of pairs and tokens, what was left out and why, the size and SHA-256 of every file). This is the
layout of fairseq's and Megatron-LM's indexed datasets: the index is small, the ids are paged in
on demand and shared through the page cache by every rank of a torchrun job, so a process's
memory does not grow with the corpus. Batches are cut from the lengths alone (aiayn.batching).

The folder is built under a hidden temporary name and renamed when complete, so a kill at any
moment leaves either no DATA_DIR or a complete one; `load_store` checks the files against the
manifest and says what is wrong with a folder it cannot use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np

from aiayn.batching import EncodedPairs, within_length
from aiayn.config import ModelConfig, PreprocessOptions, check_whole
from aiayn.corpora import STORE_MANIFEST as MANIFEST  # (named in the layer below, for aiayn.corpora to tell a DATA_DIR)
from aiayn.files import atomic_dir, file_sha256, read_json, write_json
from aiayn.tokenizer import TOKENIZER_FILES, copy_tokenizer, load_tokenizer

FORMAT = 1  # bumped whenever the layout changes; a folder of another format is refused
TEXT_SPLITS = ("dev", "test")  # their text is kept too: dev BLEU during training, test for scoring
SPLIT_SUFFIXES = ("bin", "idx.npy", "len.npy")  # SPLIT.bin, SPLIT.idx.npy, SPLIT.len.npy (the text: SPLIT.LANG)
SAMPLE_SENTENCES = PreprocessOptions.sample_sentences  # the tokenizer's sample (see PreprocessOptions)


# `load_store` checks the ids file (hundreds of MB at WMT14's size) by a digest of this many blocks
# of this size spread over it, and every other file in full; `aiayn preprocess --verify` checks
# every byte.
SAMPLED_BLOCKS, BLOCK_BYTES = 64, 1 << 16


def sampled_sha256(path: Union[str, Path]) -> str:
    """SHA-256 over SAMPLED_BLOCKS blocks of BLOCK_BYTES spread evenly over the file, first and
    last included (the whole file when it is no larger): a shifted or rewritten file changes it,
    at the cost of reading 4 MiB."""
    size = Path(path).stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= SAMPLED_BLOCKS * BLOCK_BYTES:
            digest.update(handle.read())
        else:
            for k in range(SAMPLED_BLOCKS):
                handle.seek(k * (size - BLOCK_BYTES) // (SAMPLED_BLOCKS - 1))
                digest.update(handle.read(BLOCK_BYTES))
    return digest.hexdigest()


def _digests(folder: Path, names) -> dict[str, dict[str, str]]:
    """What `preprocess` records of each file: its SHA-256, and for the ids files the sampled one."""
    return {name: {"sha256": file_sha256(folder / name),
                   **({"sampled_sha256": sampled_sha256(folder / name)} if name.endswith(".bin") else {})}
            for name in sorted(names)}


_checked: set = set()  # folders (with their files' mtimes) this process checked: a start opens its data 4 times


def _check_digests(folder: Path, manifest: dict, full: bool) -> None:
    """Each file against the digest its manifest records: in full, but for the ids files, which
    only `full` reads whole. A manifest written before digests were recorded has none to check."""
    names = [MANIFEST, *manifest.get("digests", {})]
    stats = [os.stat(folder / name) for name in names]
    key = (folder.resolve(), full, tuple((st.st_mtime_ns, st.st_ino) for st in stats))
    if key in _checked:
        return
    for name, recorded in manifest.get("digests", {}).items():
        quick = name.endswith(".bin") and not full
        found = sampled_sha256(folder / name) if quick else file_sha256(folder / name)
        if found != recorded["sampled_sha256" if quick else "sha256"]:
            raise ValueError(f"{folder / name} has changed since aiayn preprocess wrote it (its SHA-256 is not the one "
                             f"{MANIFEST} records); run aiayn preprocess again")
    _checked.add(key)


def tokenizer_digest(folder: Union[str, Path]) -> str:
    """SHA-256 over the tokenizer files a folder holds (`tokenizer.model`, or Marian's three)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Reading a DATA_DIR


class Store:
    """A DATA_DIR, checked against its manifest on opening (see `load_store`)."""

    def __init__(self, folder: Path, manifest: dict) -> None:
        self.folder, self.manifest = folder, manifest
        self.src_lang, self.tgt_lang = manifest["src_lang"], manifest["tgt_lang"]
        self.dtype = np.dtype(manifest["dtype"])
        # Mapped now, as checked: a `preprocess --force` that replaces the folder later leaves these
        # files as they were, where opening them by name later would read the new run's (found in review).
        self._pairs = {name: self._map(name) for name in manifest["splits"]}

    def __repr__(self) -> str:
        pairs = ", ".join(f"{name}: {split['pairs']:,} pairs" for name, split in self.manifest["splits"].items())
        return f"Store({str(self.folder)!r}, {self.src_lang}->{self.tgt_lang}, {pairs})"

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def split(self, name: str) -> EncodedPairs:
        """The pairs of one split, memory-mapped (nothing is read until a batch asks for it)."""
        if name not in self.manifest["splits"]:
            raise ValueError(f"{self.folder} has no split {name!r}; it has {', '.join(self.splits)}")
        return self._pairs[name]

    def _map(self, name: str) -> EncodedPairs:
        count = self.manifest["splits"][name]["tokens"]
        ids = np.memmap(self.folder / f"{name}.bin", dtype=self.dtype, mode="r", shape=(count,)) if count else \
            np.zeros(0, self.dtype)
        try:
            offsets = np.load(self.folder / f"{name}.idx.npy", mmap_mode="r")
            lengths = np.load(self.folder / f"{name}.len.npy", mmap_mode="r")
        except ValueError as error:
            raise ValueError(f"the index of split {name} in {self.folder} cannot be read: {error}") from None
        return EncodedPairs(ids, offsets, lengths)

    def texts(self, name: str) -> list[tuple[str, str]]:
        """(source, target) sentences of a dev or test split, aligned with its ids."""
        from aiayn.lines import read_lines

        if name not in self.manifest["splits"] or name not in TEXT_SPLITS:
            return []
        sides = [read_lines(self.folder / f"{name}.{lang}") for lang in (self.src_lang, self.tgt_lang)]
        return list(zip(*sides))


def _expected_files(manifest: dict) -> dict[str, int]:
    files = {}
    for split in manifest["splits"].values():
        files.update(split["files"])
    return files


def load_store(folder: Union[str, Path], verify: bool = False) -> Store:
    """Open a DATA_DIR made by `preprocess`. A folder that is not one, is of another format, or
    whose files do not match its manifest (cut short, replaced, edited, from another tokenizer)
    is a ValueError that says which file and what to do. The ids are checked by a sample of
    their blocks, unless `verify` (every byte, `aiayn preprocess --verify`)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if folder.exists() and not folder.is_dir():  # a corpus file given where its preprocessed folder goes
        corpus = folder.name.removesuffix(".xz").endswith((".tsv", ".parquet", ".mrg"))  # a file `--corpus` reads
        raise ValueError(f"{folder} is a file, not a data folder; make one " + (
            f"from it with: aiayn preprocess --corpus {folder} --out DATA_DIR" if corpus else
            "with: aiayn preprocess --corpus SPEC --out DATA_DIR"))
    if not folder.is_dir():
        raise FileNotFoundError(f"no data folder {folder}; make one with: aiayn preprocess --corpus SPEC --out {folder}")
    if not path.is_file():
        raise ValueError(f"{folder} is not a preprocessed corpus (no {MANIFEST}); make one with aiayn preprocess")
    manifest = read_json(path)
    if not isinstance(manifest, dict) or "format" not in manifest:  # (found in review: "of format None")
        raise ValueError(f"{path} is not a manifest of aiayn preprocess (it names no format); run aiayn preprocess again")
    if manifest["format"] != FORMAT:
        found = manifest["format"]
        raise ValueError(f"{folder} holds a preprocessed corpus of format {found!r}, but this aiayn reads format "
                         f"{FORMAT}; run aiayn preprocess again")
    _check_manifest(manifest, path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{folder / TOKENIZER_FILES[0]} is missing; the folder is incomplete: run aiayn preprocess again")
    for name, size in _expected_files(manifest).items():
        file = folder / name
        if not file.is_file():
            raise ValueError(f"{file} is missing; the folder is incomplete: run aiayn preprocess again")
        if file.stat().st_size != size:
            raise ValueError(f"{file} has {file.stat().st_size:,} bytes but {MANIFEST} says {size:,} "
                             "(cut short or replaced?); run aiayn preprocess again")
    if tokenizer_digest(folder) != manifest["tokenizer_sha256"]:
        raise ValueError(f"the tokenizer in {folder} is not the one its ids were made with "
                         f"({MANIFEST} records another SHA-256); run aiayn preprocess again")
    _check_digests(folder, manifest, full=verify)
    # A new model takes its vocab_size from the manifest (found in review: 900 of 1000 trained on).
    if (size := load_tokenizer(folder).vocab_size) != manifest["vocab_size"]:
        raise ValueError(f"{path} says vocab_size {manifest['vocab_size']} but its tokenizer has {size} tokens; "
                         "run aiayn preprocess again")
    store = Store(folder, manifest)
    for name in store.splits:
        _check_index(store, name)
    return store


def _check_manifest(manifest: dict, path: Path) -> None:
    """Every field a reader uses is there and of the kind `preprocess` writes: an edited manifest
    is refused here, not met as a TypeError mid-training or as ids read in another dtype (the
    digests cover the files, not the manifest)."""
    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    text = ("src_lang", "tgt_lang", "tokenizer_sha256", "corpus")
    problems = [f"no {key}" for key in (*text, "dtype", "vocab_size", "splits") if key not in manifest]
    if not problems:
        problems += [f"{key} is not a string" for key in text if not isinstance(manifest[key], str)]
        if manifest["dtype"] not in ("uint16", "uint32"):
            problems.append(f"dtype {manifest['dtype']!r} is not uint16 or uint32")
        elif not count(manifest["vocab_size"]) or manifest["vocab_size"] > np.iinfo(manifest["dtype"]).max + 1:
            problems.append(f"vocab_size {manifest['vocab_size']!r} is not a count of ids a {manifest['dtype']} holds")
        if not isinstance(manifest["splits"], dict) or not manifest["splits"]:
            problems.append("splits is not a table of splits")
    for name, split in (manifest["splits"].items() if not problems else ()):
        split = split if isinstance(split, dict) else {}
        problems += [f"split {name!r}: {key} is not a count" for key in ("pairs", "tokens") if not count(split.get(key))]
        files = split.get("files")
        if not isinstance(files, dict) or not all(Path(file).name == file and count(size) for file, size in files.items()):
            problems.append(f"split {name!r}: files is not a table of file names and sizes")
        elif missing := [f"{name}.{suffix}" for suffix in SPLIT_SUFFIXES if f"{name}.{suffix}" not in files]:
            problems.append(f"split {name!r}: files lacks {', '.join(missing)}")
        elif count(split.get("tokens")) and files[f"{name}.bin"] != split["tokens"] * np.dtype(manifest["dtype"]).itemsize:
            # (found in review: a uint32 store relabelled uint16 passed --verify and trained on other ids)
            problems.append(f"split {name!r}: {name}.bin holds {files[f'{name}.bin']:,} bytes, not {split['tokens']:,} "
                            f"{manifest['dtype']} ids")
    if not problems:
        problems += _digest_problems(manifest)
    if problems:
        raise ValueError(f"{path} is not as aiayn preprocess writes it ({'; '.join(problems)}); "
                         "run aiayn preprocess again")


def _digest_problems(manifest: dict) -> list[str]:
    """`digests` (absent from manifests written before they were recorded) names each file of
    `files` with its SHA-256, and each ids file with its sampled one too: no file goes unchecked."""
    digests = manifest.get("digests", {})
    if not isinstance(digests, dict) or not all(
            isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str)
            and (not name.endswith(".bin") or isinstance(recorded.get("sampled_sha256"), str))
            for name, recorded in digests.items()):
        return ["digests is not a table of each file's SHA-256"]
    files = set(_expected_files(manifest))
    if digests and set(digests) != files:
        return [f"digests names {', '.join(sorted(set(digests) ^ files))} but files does not, or the other way round"]
    return []


def _check_index(store: Store, name: str) -> None:
    """The index agrees with the ids file and the manifest's counts: a mismatch means the files
    come from different runs of preprocess."""
    info = store.manifest["splits"][name]
    offsets, lengths, pairs = store.split(name).offsets, store.split(name).lengths, info["pairs"]
    if offsets.shape != (pairs + 1,) or lengths.shape != (pairs, 2) or int(offsets[-1]) != info["tokens"] \
            or int(offsets[0]) != 0:
        raise ValueError(f"the index of split {name} in {store.folder} does not match {MANIFEST} "
                         f"({pairs:,} pairs, {info['tokens']:,} ids); run aiayn preprocess again")


# --------------------------------------------------------------------------------------------
# Writing a DATA_DIR


def ids_dtype(vocab_size: int) -> np.dtype:
    """uint16 where every id of the vocabulary (0 .. vocab_size - 1) fits in 16 bits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def preprocess(
    corpus, out: Union[str, Path], vocab_size: int, *,
    spec: Optional[str] = None,
    tokenizer_from: Optional[Union[str, Path]] = None,
    max_sentence_tokens: int = 256,
    sample_sentences: int = SAMPLE_SENTENCES,
    workers: int = -1,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> Store:
    """Encode a corpus into the DATA_DIR `out` (see the module docstring). `corpus` is a
    `CorpusStream` (`aiayn.corpora.stream_corpus`), read a chunk at a time so that memory does not
    grow with the corpus, or a `ParallelCorpus`.

    The shared SentencePiece model (§5.1) is learnt from a random sample of `sample_sentences`
    training sentences (all of them when fewer), drawn in one pass over the training split, or
    copied from `tokenizer_from` (a model or run folder: fine-tuning keeps its vocabulary).
    Every split is encoded on `workers` threads (-1: every core). Training pairs longer than
    `max_sentence_tokens` on either side (with BOS/EOS) are left out and counted; dev and test
    are kept whole, for scoring. An existing `out` is replaced only with `force`; the folder
    appears complete or not at all.

    Length: most of it is `build`, the folder's contents in the order they are written, which
    `atomic_dir` calls on a hidden folder.
    """
    from tqdm.auto import tqdm

    from aiayn.corpora import CorpusStream, ParallelCorpus
    from aiayn.tokenizer import Tokenizer, check_vocab_size

    if not isinstance(corpus, (ParallelCorpus, CorpusStream)):  # (found in review: a path was an AttributeError)
        raise TypeError(f"preprocess takes a corpus (aiayn.corpora.stream_corpus(spec) or load_corpus(spec)), not a "
                        f"{type(corpus).__name__}")
    check_whole(vocab_size=vocab_size, max_sentence_tokens=max_sentence_tokens)
    if tokenizer_from is None:
        check_vocab_size(vocab_size)
    stream = corpus.stream() if isinstance(corpus, ParallelCorpus) else corpus
    for lang in (stream.src_lang, stream.tgt_lang):  # SPLIT.LANG beside SPLIT.bin (found in review: bin overwrote it)
        if lang in SPLIT_SUFFIXES:
            raise ValueError(f"{lang!r} cannot name a language's files: give a code such as en or de")
    out = Path(out)
    started = time.monotonic()

    def build(tmp: Path) -> None:
        if tokenizer_from is not None:
            if not copy_tokenizer(tokenizer_from, tmp):
                raise ValueError(f"{tokenizer_from} holds no tokenizer (tokenizer.model or Marian's files)")
            echo(f"tokenizer from {tokenizer_from}")
        else:
            echo(f"sampling up to {sample_sentences:,} training sentences for the tokenizer")
            sample, total = sample_training_sentences(stream, sample_sentences)
            echo(f"training a {vocab_size}-token SentencePiece BPE model on {len(sample):,} of {total:,} "
                 "training sentences (§5.1: one vocabulary for both languages)")
            Tokenizer.train(sample, vocab_size, tmp)
            del sample
        tokenizer = load_tokenizer(tmp)
        if tokenizer_from is not None and tokenizer.vocab_size != vocab_size:
            raise ValueError(f"the tokenizer of {tokenizer_from} has {tokenizer.vocab_size} tokens, not {vocab_size}")
        dtype = ids_dtype(tokenizer.vocab_size)
        splits = {}
        with tqdm(desc="encode", unit="pair", unit_scale=True, dynamic_ncols=True, disable=not sys.stderr.isatty()) as bar:
            for name, read in stream.splits.items():
                if bar.disable:  # no progress bar in a log file: a line per split instead
                    echo(f"encoding {name}")
                limit = max_sentence_tokens if name == "train" else None
                text_langs = (stream.src_lang, stream.tgt_lang) if name in TEXT_SPLITS else ()
                splits[name] = _encode_split(tokenizer, read(), tmp, name, dtype, limit, workers, bar, text_langs)
                splits[name]["dropped_empty"] += stream.dropped.get(name, 0)
        for name, info in splits.items():
            if info["dropped_empty"] or info["dropped_long"]:
                echo(f"{name}: left out {info['dropped_empty']:,} pairs with an empty side and {info['dropped_long']:,} "
                     f"longer than max_sentence_tokens={max_sentence_tokens}")
        if "train" in splits and not (train := splits["train"])["pairs"]:  # found in review: a folder no run could train on
            raise ValueError(f"no training pair is left: {train['dropped_long']:,} were longer than --max-sentence-tokens "
                             f"{max_sentence_tokens} and {train['dropped_empty']:,} had an empty side; " + (
                                 "raise --max-sentence-tokens" if train["dropped_long"] else  # no limit helps then (found by
                                 f"the train split of corpus {stream.name} holds no pair with text on both sides"))  # a fault hunt)
        manifest = {
            "format": FORMAT,
            "corpus": spec or stream.name,
            "name": stream.name,
            "src_lang": stream.src_lang,
            "tgt_lang": stream.tgt_lang,
            "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name,
            "tokenizer_sha256": tokenizer_digest(tmp),
            "tokenizer_from": str(tokenizer_from) if tokenizer_from is not None else None,
            "sample_sentences": None if tokenizer_from is not None else sample_sentences,
            "max_sentence_tokens": max_sentence_tokens,
            "splits": splits,
            "digests": _digests(tmp, {name for info in splits.values() for name in info["files"]}),
            "seconds": round(time.monotonic() - started, 1),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        write_json(tmp / MANIFEST, manifest)

    atomic_dir(out, build, force=force)
    store = load_store(out)
    counts = ", ".join(f"{name} {info['pairs']:,} pairs" for name, info in store.manifest["splits"].items())
    echo(f"wrote {out}: {counts} in {store.manifest['seconds']:.0f} s")
    return store


def sample_training_sentences(stream, size: int, seed: int = 0) -> tuple[list[str], int]:
    """A uniform random sample of `size` training sentences, sources and targets alike, drawn in
    one pass (reservoir sampling), and how many there were. The sample keeps corpus order, all
    sources then all targets, so a corpus of at most `size` sentences gives them all, in the
    order `Tokenizer.train` would read the whole split."""
    from aiayn.corpora import clean_pairs

    rng = random.Random(seed)
    reservoir: list[tuple[int, int, str]] = []  # (side, pair index, sentence)
    seen, index, dropped = 0, 0, stream.dropped.get("train", 0)
    for chunk in stream.splits["train"]():
        kept, left_out = clean_pairs(chunk)
        dropped += left_out
        for pair in kept:
            for side, sentence in enumerate(pair):
                if seen < size:
                    reservoir.append((side, index, sentence))
                else:
                    slot = rng.randrange(seen + 1)
                    if slot < size:
                        reservoir[slot] = (side, index, sentence)
                seen += 1
            index += 1
    if not seen:  # (found by a misuse hunt: all-empty targets were "every training sentence is empty")
        raise ValueError(f"corpus {stream.name} has no training pairs: " + (
            f"each of its {dropped:,} has an empty side (source or target)" if dropped else "its train split is empty"))
    reservoir.sort(key=lambda item: item[:2])
    return [sentence for _, _, sentence in reservoir], seen


def text_digest(stream, split: str = "train") -> str:
    """SHA-256 of a split's text, as `preprocess` records it in the manifest (`text_sha256`)."""
    from aiayn.corpora import clean_pairs

    digest = hashlib.sha256()
    for chunk in stream.splits[split]():
        _update_digest(digest, clean_pairs(chunk)[0])
    return digest.hexdigest()


def _update_digest(digest, pairs: Sequence[tuple[str, str]]) -> None:
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode("utf-8", "surrogatepass"))


def _encode_split(tokenizer, chunks, folder: Path, name: str, dtype: np.dtype, limit: Optional[int],
                  workers: int, bar, text_langs: Sequence[str]) -> dict:
    """Encode one split chunk by chunk into NAME.bin (and its text, one file per language in
    `text_langs`), then write its index. Returns the split's manifest entry."""
    from aiayn.corpora import clean_pairs

    lengths, dropped_long, dropped_empty = [], 0, 0
    digest = hashlib.sha256()
    with contextlib.ExitStack() as files:
        ids_file = files.enter_context(open(folder / f"{name}.bin", "wb"))
        texts = [files.enter_context(open(folder / f"{name}.{lang}", "w", encoding="utf-8")) for lang in text_langs]
        for raw in chunks:
            chunk, empty = clean_pairs(raw)
            dropped_empty += empty
            bar.update(len(raw))
            _update_digest(digest, chunk)
            for side, handle in enumerate(texts):
                handle.write("".join(pair[side] + "\n" for pair in chunk))
            if not chunk:
                continue
            src = tokenizer.encode_batch([s for s, _ in chunk], threads=workers)
            tgt = tokenizer.encode_target_batch([t for _, t in chunk], threads=workers)
            chunk_lengths = np.stack([np.fromiter(map(len, side), np.int32, len(side)) for side in (src, tgt)], 1)  # (n, 2)
            keep = np.arange(len(chunk)) if limit is None else within_length(chunk_lengths, limit)  # (kept,)
            dropped_long += len(chunk) - len(keep)
            kept = (ids for i in keep.tolist() for ids in (src[i], tgt[i]))
            flat = np.fromiter(itertools.chain.from_iterable(kept), dtype=dtype, count=int(chunk_lengths[keep].sum()))
            ids_file.write(flat.tobytes())
            lengths.append(chunk_lengths[keep])
        ids_file.flush()
        os.fsync(ids_file.fileno())
    table = np.concatenate(lengths) if lengths else np.zeros((0, 2), np.int32)  # (N, 2)
    offsets = np.zeros(len(table) + 1, dtype=np.int64)  # (N + 1,)
    np.cumsum(table.sum(axis=1), out=offsets[1:])
    np.save(folder / f"{name}.idx.npy", offsets)
    np.save(folder / f"{name}.len.npy", table)
    written = [f"{name}.{suffix}" for suffix in SPLIT_SUFFIXES] + [f"{name}.{lang}" for lang in text_langs]
    return {"pairs": len(table), "tokens": int(offsets[-1]), "src_tokens": int(table[:, 0].sum()),
            "tgt_tokens": int(table[:, 1].sum()), "dropped_long": dropped_long, "dropped_empty": dropped_empty,
            "text_sha256": digest.hexdigest(), "files": {file: (folder / file).stat().st_size for file in written}}


def preprocess_command(options: PreprocessOptions, echo: Callable[[str], None] = print) -> None:
    """`aiayn preprocess`: encode --corpus into --out, or with --verify check a DATA_DIR's every byte."""
    from aiayn.corpora import stream_corpus
    from aiayn.files import refuse_to_replace
    from aiayn.run import resolve_model_dir, run_files
    from aiayn.tokenizer import has_tokenizer

    if options.verify is not None:
        defaults = PreprocessOptions(verify=options.verify)
        if given := [f"--{field.name.replace('_', '-')}" for field in dataclasses.fields(options)
                     if getattr(options, field.name) != getattr(defaults, field.name)]:
            raise ValueError(f"--verify only reads a DATA_DIR; drop {', '.join(given)}")  # (found in review: ignored)
        store = load_store(options.verify, verify=True)
        files = store.manifest.get("digests")
        if not files:
            raise ValueError(f"{options.verify} was written before aiayn recorded digests; nothing to verify it against")
        size = sum((Path(options.verify) / name).stat().st_size for name in files)
        echo(f"{options.verify}: all {len(files)} files match their SHA-256 ({size / 2**20:,.1f} MiB read)")
        return
    if options.corpus is None or options.out is None:
        raise ValueError("give --corpus and --out (or --verify DATA_DIR)")
    if options.vocab_size is not None and options.tokenizer is not None:
        raise ValueError("--tokenizer fixes the vocabulary; drop --vocab-size")
    read = [spec for spec in (options.corpus, options.tokenizer) if spec is not None and Path(spec).exists()]
    refuse_to_replace(options.out, options.force, inputs=read, folder=True, kept=run_files(options.out))
    vocab_size, tokenizer = options.vocab_size or ModelConfig.vocab_size, options.tokenizer
    if tokenizer is not None:
        if not has_tokenizer(tokenizer) and Path(tokenizer).is_dir():  # a run folder without one of its own, as
            with contextlib.suppress(OSError, ValueError):  # import-hf writes: its model's (found in review: refused)
                model_dir = resolve_model_dir(tokenizer)
                tokenizer = str(model_dir) if has_tokenizer(model_dir) else tokenizer
        if not has_tokenizer(tokenizer):
            given = Path(tokenizer)
            hint = f"; give its folder, {given.parent}" if given.is_file() and has_tokenizer(given.parent) else ""
            raise ValueError(f"{given} is no folder holding a tokenizer (tokenizer.model, or Marian's three files){hint}")
        vocab_size = load_tokenizer(tokenizer).vocab_size
    corpus = stream_corpus(options.corpus, options.src_lang, options.tgt_lang)
    preprocess(corpus, options.out, vocab_size, spec=options.corpus, tokenizer_from=tokenizer,
               max_sentence_tokens=options.max_sentence_tokens, sample_sentences=options.sample_sentences,
               workers=options.workers or -1, force=options.force)


__all__ = ["Store", "load_store", "preprocess",
           "sample_training_sentences", "text_digest", "tokenizer_digest", "FORMAT", "MANIFEST"]
