"""The shared BPE vocabulary of §5.1: special ids, lossless round trips (byte fallback for unseen
characters), repeatable training, and one-line errors for impossible vocabulary sizes."""

import pytest

from aiayn.config import ModelConfig
from aiayn.tokenizer import MODEL_FILE, Tokenizer

ENGLISH = [
    "In the beginning, God created the heavens and the earth.",
    "The earth was formless and empty. Darkness was on the surface of the deep.",
    "God said, “Let there be light,” and there was light.",
    "God saw the light, and saw that it was good. God divided the light from the darkness.",
    "There was evening and there was morning, the first day.",
]
SPANISH = [
    "En el principio creó Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía, y las tinieblas estaban sobre la haz del abismo.",
    "Y dijo Dios: Sea la luz; y fué la luz. ¿Quién sabe? ¡Qué niño está aquí!",
    "Y vió Dios que la luz era buena: y apartó Dios la luz de las tinieblas.",
    "Y fué la tarde y la mañana un día. Canción, corazón, pingüino, Ñandú.",
]
TEXTS = (ENGLISH + SPANISH) * 20
VOCAB = 400


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tok")
    return Tokenizer.train(TEXTS, VOCAB, directory), directory


def test_train_writes_the_model_file_and_specials_match_the_model_config(trained):
    tokenizer, directory = trained
    assert (directory / MODEL_FILE).is_file()
    assert not [p for p in directory.iterdir() if p.name != MODEL_FILE]  # no temporary left behind
    assert tokenizer.vocab_size == VOCAB
    config = ModelConfig()
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (
        config.pad_id, config.bos_id, config.eos_id, config.unk_id)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize("text", [*ENGLISH, *SPANISH, "niño está canción", "Él dijo: «¿Por qué?»"])
def test_decode_inverts_encode(trained, text):
    tokenizer, _ = trained
    ids = tokenizer.encode(text)
    assert tokenizer.bos_id not in ids and tokenizer.eos_id not in ids  # the batcher adds them
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", ["你好，世界", "Hola 🙂 👋🏽", "Ελληνικά και русский"])
def test_unseen_characters_fall_back_to_bytes_not_unk(trained, text):
    tokenizer, _ = trained
    ids = tokenizer.encode(text)
    assert tokenizer.unk_id not in ids
    assert tokenizer.decode(ids) == text


def test_decode_drops_padding_bos_and_eos(trained):
    tokenizer, _ = trained
    ids = tokenizer.encode("the light")
    t = tokenizer
    assert tokenizer.decode([t.bos_id, *ids, t.eos_id, t.pad_id, t.pad_id]) == "the light"


def test_piece_to_id_inverts_id_to_piece(trained):
    tokenizer, _ = trained
    assert all(tokenizer.piece_to_id(tokenizer.id_to_piece(i)) == i for i in range(tokenizer.vocab_size))
    assert tokenizer.piece_to_id("no such piece") == tokenizer.unk_id


def test_encode_batch_equals_encode(trained):
    tokenizer, _ = trained
    texts = ENGLISH + SPANISH + ["", "你好"]
    for threads in (-1, 1, 2):  # 1: text by text, as a server encodes a request's (no pool of threads)
        assert tokenizer.encode_batch(texts, threads) == [tokenizer.encode(t) for t in texts]


def test_training_is_deterministic(tmp_path, trained):
    _, first = trained
    Tokenizer.train(iter(TEXTS), VOCAB, tmp_path)  # any iterable, here a one-shot iterator
    assert (tmp_path / MODEL_FILE).read_bytes() == (first / MODEL_FILE).read_bytes()


def test_load_from_folder_or_file_and_save(trained, tmp_path):
    tokenizer, directory = trained
    text = SPANISH[2]
    assert Tokenizer.load(directory).encode(text) == tokenizer.encode(text)
    assert Tokenizer.load(directory / MODEL_FILE).encode(text) == tokenizer.encode(text)
    tokenizer.save(tmp_path / "copy")
    assert (tmp_path / "copy" / MODEL_FILE).read_bytes() == (directory / MODEL_FILE).read_bytes()


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        Tokenizer.load(tmp_path)
    (tmp_path / MODEL_FILE).write_bytes(b"not a model")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize(
    "texts, vocab_size, message",
    [
        # Below 261 no text fits, and the message names no minimum it would then raise (was "at least 261").
        (TEXTS, 100, "vocab_size=100 is too small: .* so more than 260 "),
        (TEXTS, 270, r"vocab_size=270 is too small for this training text: it needs at least \d+"),
        (TEXTS, 50000, r"use a smaller --vocab-size \(at most \d+\)"),
        (["", ""], 300, "every training sentence is empty"),
        (["   ", " "], 300, "every training sentence is empty or whitespace"),  # was SentencePiece's C++ check
    ],
)
def test_impossible_vocabulary_sizes_are_clear_errors(tmp_path, texts, vocab_size, message):
    with pytest.raises(ValueError, match=message):
        Tokenizer.train(texts, vocab_size, tmp_path)
    assert not (tmp_path / MODEL_FILE).exists()


def test_the_vocabulary_floor_is_261():
    """Found by mutation: `<` as `<=` passed every test."""
    from aiayn.tokenizer import check_vocab_size

    check_vocab_size(261)
    with pytest.raises(ValueError, match="so more than 260"):
        check_vocab_size(260)


def test_sentences_longer_than_sentencepieces_default_limit_are_learned(tmp_path):
    """SentencePiece leaves out sentences over 4,192 bytes unless told otherwise (found in review:
    a corpus of long paragraphs got a vocabulary that spelled them in bytes)."""
    short = [f"the small cat sees a big dog near the river {i}" for i in range(200)]
    paragraph = " ".join(["жук щит мир дом кот"] * 400)  # 14,000 bytes
    assert len(paragraph.encode("utf-8")) > 4192
    tokenizer = Tokenizer.train(short + [paragraph] * 20, 400, tmp_path)
    assert [tokenizer.id_to_piece(i) for i in tokenizer.encode("жук щит")] == ["▁жук", "▁щит"]


def test_marian_targets_are_encoded_with_the_target_model_and_its_vocabulary_needs_the_specials(tmp_path):
    """Marian has a SentencePiece model per side and one vocab.json: a fine-tuning run's targets
    are cut by the target's (the test fixture of test_marian.py has one model twice, so it cannot
    tell); a vocab.json without <pad>, </s> or <unk> is refused on load, not a KeyError later
    (found by mutation: both passed every test)."""
    import json

    import sentencepiece as spm

    from aiayn.tokenizer import MarianTokenizer

    models = {}
    for name, texts in (("source", ENGLISH), ("target", SPANISH)):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts * 20), model_prefix=str(tmp_path / name),
                                       vocab_size=60, model_type="bpe", minloglevel=2, num_threads=1)
        (tmp_path / f"{name}.model").rename(tmp_path / f"{name}.spm")
        models[name] = spm.SentencePieceProcessor(model_file=str(tmp_path / f"{name}.spm"))
    pieces = ["</s>", "<unk>"] + sorted({sp.id_to_piece(i) for sp in models.values() for i in range(3, sp.get_piece_size())})
    vocab = {piece: i for i, piece in enumerate(pieces)} | {"<pad>": len(pieces)}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = MarianTokenizer.load(tmp_path)
    for text in SPANISH:
        expected = [vocab[piece] for piece in models["target"].encode(text, out_type=str)]
        assert tokenizer.encode_target_batch([text])[0] == expected
        assert tokenizer.decode(expected + [tokenizer.eos_id, tokenizer.pad_id]) == text
    assert tokenizer.encode_target_batch(SPANISH) != tokenizer.encode_batch(SPANISH)
    for batch in (tokenizer.encode_batch, tokenizer.encode_target_batch):  # text by text, as a server encodes them
        assert batch(ENGLISH + SPANISH, threads=1) == batch(ENGLISH + SPANISH, threads=-1)
    for special in ("<pad>", "</s>", "<unk>"):
        (tmp_path / "vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != special}))
        with pytest.raises(ValueError, match=f"vocab.json lacks the special token {special}"):
            MarianTokenizer.load(tmp_path)
