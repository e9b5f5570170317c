"""One SentencePiece BPE vocabulary shared by source and target (§5.1).

The paper encodes sentences "using byte-pair encoding, which has a shared source-target vocabulary
of about 37000 tokens". `Tokenizer.train` learns such a model from the source and target sentences
of the training split together; the model is one file, `tokenizer.model`, saved beside the weights.

Special ids match `ModelConfig`'s defaults: pad 0, bos 1, eos 2, unk 3. Byte fallback is on, so a
character never seen in training (Chinese, an emoji) is spelt as its UTF-8 bytes instead of
becoming <unk>. Text is not Unicode-normalised, so every string without leading, trailing or
repeated spaces survives encode -> decode unchanged, but for SentencePiece's own space mark, U+2581
(▁), which decodes as a space (found in review).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path
from typing import Iterable, Sequence, Union

import sentencepiece as spm

from aiayn.files import atomic_write

MODEL_FILE = "tokenizer.model"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# 256 byte pieces for byte fallback, the 4 special tokens, and at least one character of text.
MIN_VOCAB_SIZE = 256 + 4 + 1


def encode_texts(processor: spm.SentencePieceProcessor, texts: Sequence[str], threads: int, **how) -> list:
    """SentencePiece's encoding of each text on `threads` threads (-1: every core). SentencePiece
    starts a pool of threads for any list, even of one text on one thread (about 40 µs, against 8 to
    encode a verse, on an AMD EPYC; more beside a server's busy workers), so one thread encodes the
    texts one by one."""
    if threads == 1:
        return [processor.encode(text, **how) for text in texts]
    return processor.encode(list(texts), num_threads=threads, **how)


class Tokenizer:
    """A trained SentencePiece BPE model. Encoding adds no BOS/EOS: the batcher adds them."""

    def __init__(self, model_proto: bytes) -> None:
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        directory: Union[str, Path],
    ) -> "Tokenizer":
        """Learn a BPE vocabulary of `vocab_size` pieces from `texts` and write
        `directory/tokenizer.model`.

        Pass the source AND the target sentences: the vocabulary is shared (§5.1); for a large
        corpus, a sample of them (`aiayn.store.sample_training_sentences`). Training twice on the
        same input gives byte-identical models.
        """
        check_vocab_size(vocab_size)
        texts = list(texts)
        # SentencePiece leaves out, without a word, every sentence longer than max_sentence_length
        # bytes (4,192 by default; found in review: a corpus of paragraphs got a vocabulary that
        # never saw them): the longest here sets it.
        longest = max((len(text.encode("utf-8")) for text in texts), default=0)
        proto = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                max_sentence_length=max(longest + 1, 4192),
                model_writer=proto,
                model_type="bpe",
                vocab_size=vocab_size,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                byte_fallback=True,
                character_coverage=1.0,
                # Text as it is, not NFKC: the model can then write what references hold, such as
                # full-width CJK punctuation, and decode(encode(s)) == s.
                normalization_rule_name="identity",
                # The learned merges depend on the thread count; one thread gives the same model
                # on every machine.
                num_threads=1,
                minloglevel=2,  # SentencePiece logs every merge to stderr otherwise
            )
        except RuntimeError as error:
            raise ValueError(_explain_training_error(str(error), vocab_size)) from None
        tokenizer = cls(proto.getvalue())
        tokenizer.save(directory)
        return tokenizer

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Tokenizer":
        """From a `tokenizer.model` file, or a folder that holds one."""
        path = Path(path)
        file = path / MODEL_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer at {path}: expected a {MODEL_FILE} file or a folder holding one")
        try:
            data = file.read_bytes()
            if not data:  # SentencePiece would load it as a model of no pieces, printing its own errors
                raise ValueError(f"{file} is empty, not a SentencePiece model")
            return cls(data)
        except (RuntimeError, OSError) as error:
            raise ValueError(f"{file} is not a SentencePiece model: {error}") from None

    def save(self, directory: Union[str, Path]) -> None:
        """Write the model to `directory/tokenizer.model` (created if missing), atomically."""
        atomic_write(Path(directory) / MODEL_FILE, lambda tmp: Path(tmp).write_bytes(self._proto))

    def encode(self, text: str) -> list[int]:
        """Piece ids of `text`, without BOS or EOS."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], threads: int = -1) -> list[list[int]]:
        """`encode` of every text, on `threads` of SentencePiece's C++ threads (-1: every core; 1: on
        this one, as a server encodes a request's few texts: `encode_texts`)."""
        return encode_texts(self._sp, texts, threads)

    def encode_target_batch(self, texts: Sequence[str], threads: int = -1) -> list[list[int]]:
        """Targets share the source's model (§5.1); `MarianTokenizer` has one per side."""
        return self.encode_batch(texts, threads)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; padding, BOS and EOS are dropped, so model outputs decode as they are."""
        special = {self.pad_id, self.bos_id, self.eos_id}
        return self._sp.decode([int(i) for i in ids if int(i) not in special])

    def id_to_piece(self, id: int) -> str:
        """The piece an id stands for (e.g. '▁the'), for labelling attention maps."""
        return self._sp.id_to_piece(int(id))

    def piece_to_id(self, piece: str) -> int:
        """The id of a piece (the unknown id for a piece not in the vocabulary)."""
        return self._sp.piece_to_id(piece)

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model, as `tokenizer.model` holds it."""
        return self._proto

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def pad_id(self) -> int:
        return self._sp.pad_id()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


SOURCE_SPM, TARGET_SPM, VOCAB_JSON = "source.spm", "target.spm", "vocab.json"
# A model folder holds its tokenizer: aiayn's one SentencePiece model, or Marian's three files.
TOKENIZER_FILES = (MODEL_FILE, SOURCE_SPM, TARGET_SPM, VOCAB_JSON)


class MarianTokenizer:
    """The tokenizer of Marian (OPUS-MT) models: a SentencePiece model per side whose pieces map to
    ids through one shared vocabulary, `vocab.json`; the files are those of an HF Marian folder.
    Encoding adds no EOS (the batcher does). A leading language tag such as `>>fr<<`, which
    multilingual models read, is kept as one token. Decoding starts from the pad token.
    """

    def __init__(self, source: bytes, target: bytes, vocab: dict[str, int]) -> None:
        self._files = {SOURCE_SPM: source, TARGET_SPM: target}
        if empty := [name for name, data in self._files.items() if not data]:  # loaded as no model (found in review:
            raise RuntimeError(f"{empty[0]} is empty")  # "Model is not initialized" when it first encoded)
        self._source = spm.SentencePieceProcessor(model_proto=source)
        self._target = spm.SentencePieceProcessor(model_proto=target)
        self.vocab = vocab
        self._pieces = {i: piece for piece, i in vocab.items()}
        for piece in ("<pad>", "</s>", "<unk>"):
            if piece not in vocab:
                raise ValueError(f"{VOCAB_JSON} lacks the special token {piece}")

    @staticmethod
    def is_in(directory: Union[str, Path]) -> bool:
        return all((Path(directory) / name).is_file() for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON))

    @classmethod
    def load(cls, directory: Union[str, Path]) -> "MarianTokenizer":
        directory = Path(directory)
        try:
            vocab = json.loads((directory / VOCAB_JSON).read_text(encoding="utf-8"))
            if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
                raise ValueError(f"{directory / VOCAB_JSON} must map each piece to its id (a JSON object)")
            return cls((directory / SOURCE_SPM).read_bytes(), (directory / TARGET_SPM).read_bytes(), vocab)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"cannot read the Marian tokenizer in {directory}: {error}") from None
        except RuntimeError as error:
            raise ValueError(f"{directory} holds a broken SentencePiece model: {error}") from None

    def save(self, directory: Union[str, Path]) -> None:
        directory = Path(directory)
        for name, data in self._files.items():
            atomic_write(directory / name, lambda tmp, data=data: Path(tmp).write_bytes(data))
        text = json.dumps(self.vocab, ensure_ascii=False, indent=1)
        atomic_write(directory / VOCAB_JSON, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def _ids(self, processor: spm.SentencePieceProcessor, texts: Sequence[str], threads: int) -> list[list[int]]:
        tags, rests = [], []
        for text in texts:
            end = text.index("<<") + 2 if text.startswith(">>") and "<<" in text else 0
            tags.append([text[:end]] if end else [])
            rests.append(text[end:])
        pieces = encode_texts(processor, rests, threads, out_type=str)
        return [[self.vocab.get(piece, self.unk_id) for piece in tag + rest] for tag, rest in zip(tags, pieces)]

    def encode(self, text: str) -> list[int]:
        """Ids of a source sentence, without EOS."""
        return self._ids(self._source, [text], 1)[0]

    def encode_batch(self, texts: Sequence[str], threads: int = -1) -> list[list[int]]:
        return self._ids(self._source, texts, threads)

    def encode_target_batch(self, texts: Sequence[str], threads: int = -1) -> list[list[int]]:
        return self._ids(self._target, texts, threads)

    def decode(self, ids: Sequence[int]) -> str:
        """Target text of `ids`; padding and EOS are dropped."""
        special = {self.pad_id, self.eos_id}
        pieces = [self._pieces.get(int(i), "<unk>") for i in ids if int(i) not in special]
        return self._target.decode_pieces(pieces)

    def id_to_piece(self, id: int) -> str:
        return self._pieces.get(int(id), "<unk>")

    @property
    def vocab_size(self) -> int:
        return max(self._pieces) + 1

    @property
    def pad_id(self) -> int:
        return self.vocab["<pad>"]

    @property
    def bos_id(self) -> int:
        return self.pad_id  # Marian's decoder starts from the pad token

    @property
    def eos_id(self) -> int:
        return self.vocab["</s>"]

    @property
    def unk_id(self) -> int:
        return self.vocab["<unk>"]

    def __repr__(self) -> str:
        return f"MarianTokenizer(vocab_size={self.vocab_size})"


def has_tokenizer(directory: Union[str, Path]) -> bool:
    """Whether a folder holds a tokenizer: `tokenizer.model`, or Marian's three files."""
    return (Path(directory) / MODEL_FILE).is_file() or MarianTokenizer.is_in(directory)


def tokenizer_files(directory: Union[str, Path]) -> list[Path]:
    """The files of the tokenizer a folder holds (see `has_tokenizer`); none if it holds none."""
    directory = Path(directory)
    if MarianTokenizer.is_in(directory):
        return [directory / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)]
    return [directory / MODEL_FILE] if (directory / MODEL_FILE).is_file() else []


def check_vocab_size(vocab_size: int) -> None:
    """A ValueError for a vocabulary no text fits in, before any text is read for it (found in a
    docs audit: `--vocab-size 5` was refused after the corpus had been sampled)."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: it needs 256 byte pieces, 4 special tokens and a piece "
            f"for every distinct character of the training text, so more than {MIN_VOCAB_SIZE - 1} (a few "
            "hundred for most texts; from 261 on the error names the exact minimum)")


def load_tokenizer(path: Union[str, Path]) -> Union[Tokenizer, MarianTokenizer]:
    """The tokenizer a model or run folder holds: `tokenizer.model`, or Marian's three files."""
    if Path(path).is_dir() and MarianTokenizer.is_in(path):
        return MarianTokenizer.load(path)
    return Tokenizer.load(path)


def _explain_training_error(message: str, vocab_size: int) -> str:
    """SentencePiece's errors quote C++ checks; say what the user should change instead."""
    too_high = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message)
    if too_high:
        return (
            f"vocab_size={vocab_size} is larger than this training text allows; "
            f"use a smaller --vocab-size (at most {too_high.group(1)})"
        )
    too_small = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message)
    if too_small:
        return (
            f"vocab_size={vocab_size} is too small for this training text: it needs at least "
            f"{too_small.group(1)} (256 byte pieces, 4 special tokens and every distinct character)"
        )
    if "sentences_.empty()" in message or "all_chars_count" in message:  # no sentence, or only spaces
        return "cannot train a tokenizer on no text: every training sentence is empty or whitespace"
    return f"SentencePiece training failed: {message.strip() or 'unknown error'}"


__all__ = ["Tokenizer", "MarianTokenizer", "check_vocab_size", "has_tokenizer", "load_tokenizer", "MODEL_FILE", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "MIN_VOCAB_SIZE"]


def copy_tokenizer(source: Union[str, Path], destination: Union[str, Path]) -> bool:
    """Copy whichever tokenizer files `source` holds into `destination`; False if it holds none."""
    found = tokenizer_files(source)
    for path in found:
        atomic_write(Path(destination) / path.name, lambda tmp, path=path: shutil.copyfile(path, tmp))
    return bool(found)
