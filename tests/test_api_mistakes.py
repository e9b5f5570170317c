"""A newcomer's mistakes with the Python API: each a one-line error saying what to do, never a
silent wrong result (a string translated character by character, a pair from the wrong end)."""

import dataclasses

import pytest
import torch

from aiayn.attention import MultiHeadAttention
from aiayn.batching import EncodedPairs
from aiayn.config import ModelConfig
from aiayn.evaluate import score
from aiayn.experiment import SCALES, miniature, run_table3, select_rows
from aiayn.model import DecoderModel, Transformer
from aiayn.run import average_checkpoints
from aiayn.search import BeamSearch, greedy
from aiayn.translate import ModelStep, Translator, translate_ids
from test_faults import make_model


def test_a_translator_takes_a_list_and_needs_a_tokenizer(tmp_path):
    translator = Translator.load(make_model(tmp_path / "model"), "cpu")
    with pytest.raises(ValueError, match=r"a list of sentences, not a string: translate\(\[text\]\)\[0\]"):
        translator.translate("the cat")
    one = translator.translate(["the cat"])
    assert repr(translator).startswith("Translator(d_model=") and "decode=DecodeConfig(beam=4, alpha=0.6" in repr(translator)
    assert len(one) == 1
    pairs = zip(["the cat"], ["the cat"])  # read twice inside: a zip once was "1 hypotheses but 0 references"
    assert score(translator, pairs).hypotheses == one
    with pytest.raises(ValueError, match="no tokenizer"):
        Translator(translator.model).translate(["the cat"])
    with pytest.raises(ValueError, match=r"decode takes a DecodeConfig \(DecodeConfig\(beam=1\)\), not a dict"):
        Translator(translator.model, decode={"beam": 1})
    with pytest.raises(ValueError, match="no sentences to score"):  # was sacreBLEU's IndexError
        score(translator, [])
    with pytest.raises(ValueError, match=r"\(source, reference\) pairs: zip\(sources, references\)"):
        score(translator, ["ab"])  # was scored as source "a", reference "b"
    with pytest.raises(ValueError, match="at least one checkpoint folder"):  # was an IndexError
        average_checkpoints([], tmp_path / "avg")


def test_pairs_count_from_the_end_as_a_list_does():
    pairs = EncodedPairs.from_lists([([5, 6], [7, 8, 9]), ([10, 11, 12], [13])])
    for i in (-2, -1):
        assert [a.tolist() for a in pairs[i]] == [a.tolist() for a in pairs[i + 2]]
    assert [a.tolist() for a in pairs[-2]] == [[5, 6], [7, 8, 9]]
    for i in (2, -3):
        with pytest.raises(IndexError, match=f"pair {i} of 2"):
            pairs[i]


def test_decoding_with_a_cache_checks_the_tokens_given():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1)).eval()
    src = torch.tensor([[5, 6, 7, 2]])
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, max_len=4)
    with pytest.raises(ValueError, match="tgt"):
        model.decode(torch.tensor([[90]]), cache=cache)  # was IndexError from inside the embedding
    assert model.decode(torch.tensor([[1]]), cache=cache).shape == (1, 1, 50)
    with pytest.raises(ValueError, match="this step has 2 rows of tokens; the KV cache was made for 1"):
        model.decode(torch.tensor([[1], [1]]), cache=cache)  # was an expand error from inside PyTorch
    with pytest.raises(ValueError, match="at least one position: max_len 0"):
        model.init_cache(memory, mask, max_len=0)  # was "cannot reshape tensor of 0 elements"
    with pytest.raises(TypeError, match="max_len is a number of positions, an int; got 4.0"):
        model.init_cache(memory, mask, max_len=4.0)  # was torch.zeros' "must be tuple of ints, not float"
    decoder_only = DecoderModel(model.config).eval()
    cache = decoder_only.init_cache(batch=1, max_len=4)
    with pytest.raises(ValueError, match="the KV cache was made for 1"):
        decoder_only(torch.tensor([[1], [1]]), cache=cache)
    with pytest.raises(ValueError, match="tokens"):
        decoder_only(torch.tensor([[90]]), cache=cache)  # was IndexError from inside the embedding


def test_the_target_positions_to_score_are_checked():
    """`positions` of Transformer.forward (the training step's targets that hold a token): a 2-D
    tensor was index_select's "Index is supposed to be a vector", one out of range its IndexError."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1)).eval()
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 4))
    whole = model(src, tgt).flatten(0, 1)  # (8, V)
    assert torch.allclose(model(src, tgt, positions=torch.tensor([0, 7])), whole[[0, 7]], atol=1e-6)
    for positions in (torch.tensor([[0, 1]]), torch.tensor([0.0, 1.0])):
        with pytest.raises(ValueError, match=r"positions must be a LongTensor \(N,\) of flat indices"):
            model(src, tgt, positions=positions)
    for outside in (8, -1):
        with pytest.raises(ValueError, match="outside the 8 target positions"):
            model(src, tgt, positions=torch.tensor([0, outside]))


def test_translate_ids_checks_its_sources_settings_and_mode():
    """Found in review: text, a flat list of ids, float ids, a dict of settings and n_best failed
    deep in PyTorch or were taken silently (floats cut to ids, n_best dropped); a model in train
    mode decoded with dropout; an empty batch divided by zero in the attention."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1)).eval()
    expected = translate_ids(model, [[5, 6, 7]], beam=1)
    assert translate_ids(model, [(5, 6, 7)], beam=1) == translate_ids(model, torch.tensor([[5, 6, 7]]), beam=1) == expected
    for sources, says in ((["the cat"], r"sources\[0\] must be a list of token ids"), ([5, 6, 7], r"sources\[0\]"),
                          ([[5.5, 6.2]], r"sources\[0\] .* '\[5.5, 6.2\]'"), ("the cat", "encode text with the tokenizer")):
        with pytest.raises(TypeError, match=says):
            translate_ids(model, sources)
    with pytest.raises(TypeError, match=r"decode must be a DecodeConfig, got dict; .* keywords \(beam=2\)"):
        translate_ids(model, [[5]], {"beam": 2})
    with pytest.raises(TypeError, match="translate_nbest of token ids"):
        translate_ids(model, [[5]], n_best=2)
    with pytest.raises(ValueError, match="a batch of no sequences"):
        model(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"eval mode: call model.eval\(\) first"):
        ModelStep(model.train(), torch.tensor([[5, 2]]), 5)
    with pytest.raises(ValueError, match="n_heads of at least 1, got 16 and 0"):
        MultiHeadAttention(16, 0)
    with pytest.raises(ValueError, match=r"attention_maps needs the model in eval mode"):
        model.attention_maps(torch.tensor([[5, 2]]), torch.tensor([[1, 5]]))


def test_the_search_takes_its_limits_as_a_tensor():
    with pytest.raises(TypeError, match=r"an integer tensor \(B,\) such as torch.full\(\(B,\), 60\); got 60"):
        greedy(lambda tokens: None, lambda rows: None, 1, 2, max_len=60)  # was "'int' object has no attribute 'device'"
    for limits in (torch.full((1,), 6.0), torch.full((1, 1), 6)):  # were a pad() TypeError, a list compared with an int
        with pytest.raises(TypeError, match=r"an integer tensor \(B,\) .*; got a torch\.\w+ tensor of shape"):
            greedy(lambda tokens: None, lambda rows: None, 1, 2, max_len=limits)
    with pytest.raises(TypeError, match="max_len is each sentence's limit"):  # the server's way in: was 'numel'
        BeamSearch(lambda tokens: None, lambda *rows: None, 1, 2, torch.device("cpu")).join(60, ["a"])


def test_table3_rows_and_scales_by_name():
    with pytest.raises(ValueError, match="unknown Table 3 row 'Z9'; choose from base"):
        miniature("Z9", SCALES["small"])
    with pytest.raises(ValueError, match="unknown scale 'huge'"):
        miniature("C5", "huge")
    assert miniature("C5", "small") == miniature("C5", SCALES["small"])
    assert select_rows("base") == ["base"]  # a string is one row, not its letters
    with pytest.raises(ValueError, match=r"no Table 3 rows given.*rows=None for all"):  # found in review: all 20 rows ran
        select_rows([])


def test_a_newcomers_types_are_refused_before_any_work(tmp_path, capsys):
    """Found in review: each of these was an AttributeError deep inside, an IndexError from
    SentencePiece after a whole decoding, or a silent wrong result."""
    from aiayn.evaluate import bleu, chrf
    from aiayn.serve.app import create_app
    from aiayn.tokenizer import load_tokenizer

    folder = make_model(tmp_path / "model")
    model, tokenizer = Transformer.load(folder), load_tokenizer(folder)
    assert not model.training  # as transformers' from_pretrained: two calls give one answer
    other = Transformer(dataclasses.replace(model.config, vocab_size=model.config.vocab_size + 1))
    for wrong, says in (({"vocab_size": 50}, r"ModelConfig \(ModelConfig.from_dict\(values\)\), not a dict"),
                        ("base", r"ModelConfig \(PRESETS\[name\]\), not a str")):
        with pytest.raises(TypeError, match=says):
            Transformer(wrong)
    with pytest.raises(TypeError, match=r"not a str; for a folder or checkpoint: Translator.load\("):
        Translator(str(folder), tokenizer)
    with pytest.raises(TypeError, match="tokenizer takes a Tokenizer .* not a str"):
        Translator(model, str(folder))
    with pytest.raises(ValueError, match=f"the tokenizer has {tokenizer.vocab_size} tokens, the model"):
        Translator(other, tokenizer)
    with pytest.raises(TypeError, match="create_app needs the model's tokenizer"):
        create_app(model, None)
    translator = Translator(model, tokenizer)
    with pytest.raises(ValueError, match="stream takes a list of sentences, not a string"):
        translator.stream("Jesus wept.", print)
    with pytest.raises(TypeError, match="write takes a function"):
        translator.stream(["Jesus wept."], None)
    assert translator.translate(["the cat"], progress=True) == translator.translate(["the cat"])  # a bar of its own
    for scoring in (lambda: bleu("the cat", "the cat"), lambda: chrf("a", "a")):
        with pytest.raises(ValueError, match="lists of sentences, not strings"):
            scoring()
    with pytest.raises(ValueError, match="no sentences to score"):
        bleu([], [])
    seen = []
    translator.translate_ids = lambda *args, **kwargs: seen.append(1)  # nothing is decoded before the refusal
    with pytest.raises(ValueError, match="the Moses tokenizer has no rules for 'xx'"):
        score(translator, [("the cat", "el gato")], lang="xx")
    assert not seen
    checkpoint = str(folder)
    with pytest.raises(ValueError, match="a list of checkpoint folders, not one path"):
        average_checkpoints(checkpoint, tmp_path / "avg")
    average_checkpoints([checkpoint, checkpoint], tmp_path / "avg")  # str paths: averaged and written
    assert (tmp_path / "avg" / "model.safetensors").is_file()


def test_configs_take_paths_and_numpys_numbers_as_what_they_are():
    """Found in review: TrainConfig(corpus=Path(...)) was refused where every function takes a
    Path, and ModelConfig(vocab_size=np.int64(8000)), as a tokenizer's arithmetic gives it."""
    from pathlib import Path

    import numpy as np

    from aiayn.config import DecodeConfig, TrainConfig

    config = ModelConfig(vocab_size=np.int64(8000), d_model=np.int32(64), n_heads=4, dropout=np.float32(0.25))
    assert (config.vocab_size, config.d_model, config.dropout) == (8000, 64, 0.25)
    assert type(config.vocab_size) is int and type(config.dropout) is float
    assert ModelConfig.from_dict(config.to_dict()) == config  # and it saves as JSON
    assert TrainConfig(corpus=Path("corpora") / "toy.tsv").corpus == str(Path("corpora") / "toy.tsv")
    assert type(DecodeConfig(beam=np.int64(2)).beam) is int
    with pytest.raises(ValueError, match="vocab_size must be an integer, got np.float64"):
        ModelConfig(vocab_size=np.float64(3.5))
    from fractions import Fraction

    with pytest.raises(ValueError, match=r"d_model must be an integer, got Fraction\(512, 1\)"):  # (it said 512.0)
        ModelConfig(d_model=Fraction(512))


def test_a_translators_calls_and_a_models_folder_say_what_to_do(tmp_path):
    """Found in review: decode= in a call was a TypeError of 'multiple values', precision= blamed
    the copy, progress="yes" an AttributeError after a batch was decoded, a list of numbers
    SentencePiece's words; Transformer.load of a run folder did not point at its model; save()
    replaced a run's model without a word."""
    from aiayn.config import DecodeConfig

    folder = make_model(tmp_path / "run" / "model")
    translator = Translator.load(folder, "cpu")
    with pytest.raises(TypeError, match=r"give a call's changes as keywords \(beam=2\)"):
        translator.translate(["the cat"], decode=DecodeConfig(beam=2))
    with pytest.raises(ValueError, match=r"decodes in fp32.*Translator.load\(path, decode=DecodeConfig\(precision='int8'\)\)"):
        translator.translate_ids([[5, 6]], precision="int8")
    assert translator.translate(["the cat"], precision="fp32", beam=2) == translator.translate(["the cat"], beam=2)
    with pytest.raises(TypeError, match="progress takes a tqdm bar .*not a str"):
        translator.translate(["the cat"], progress="yes")
    with pytest.raises(TypeError, match="progress takes a tqdm bar"):
        translate_ids(translator.model, [[5, 6]], progress=1)
    with pytest.raises(TypeError, match="a list of strings, not of int: 1"):
        translator.translate([1, 2])
    with pytest.raises(FileNotFoundError, match=r"it holds one, .*run/model \(a run's final model"):
        Transformer.load(tmp_path / "run")
    weights = (folder / "model.safetensors").read_bytes()
    other = Transformer(dataclasses.replace(translator.config, d_ff=translator.config.d_ff * 2))
    with pytest.raises(FileExistsError, match=r"holds a model already \(model.safetensors\); pass force=True"):
        other.save(folder)
    assert (folder / "model.safetensors").read_bytes() == weights
    other.save(folder, force=True)
    assert Transformer.load(folder).config.d_ff == translator.config.d_ff * 2


def test_the_training_apis_types_are_refused_before_any_work(tmp_path):
    """Found in review: a path where a corpus is meant, numbers as strings, seed=None, a Store
    where its split is meant, a scale of None, the model config and the training settings swapped:
    AttributeErrors and TypeErrors from deep inside (numpy's, '<' between str and int)."""
    from aiayn.batching import BatchStream
    from aiayn.config import PRESETS, TrainConfig
    from aiayn.corpora import ParallelCorpus
    from aiayn.store import preprocess
    from aiayn.train import train_run

    corpus = ParallelCorpus("toy", "en", "es", {"train": [("the cat", "el gato")] * 20})
    with pytest.raises(TypeError, match="preprocess takes a corpus .*not a str"):
        preprocess("pairs.tsv", tmp_path / "data", vocab_size=40)
    with pytest.raises(TypeError, match="vocab_size takes a whole number, not '40'"):
        preprocess(corpus, tmp_path / "data", vocab_size="40")
    pairs = [([5, 6], [7, 8])] * 4
    with pytest.raises(TypeError, match="max_tokens takes a whole number, not '300'"):
        BatchStream(pairs, max_tokens="300", seed=0, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(TypeError, match="seed takes a whole number, not None"):
        BatchStream(pairs, max_tokens=300, seed=None, pad_id=0, bos_id=1, eos_id=2)

    class Store:  # as a Store is: splits by name
        def split(self, name):
            return pairs

    with pytest.raises(TypeError, match=r"a split's pairs \(store.split\('train'\)\), not the store"):
        BatchStream(Store(), max_tokens=300, seed=0, pad_id=0, bos_id=1, eos_id=2)
    with pytest.raises(TypeError, match="scale takes a Scale or its name .*not a NoneType"):
        miniature("base", None)
    with pytest.raises(TypeError, match="steps takes a whole number, not '2'"):
        run_table3(tmp_path / "table3", scale_name="tiny", rows=["base"], steps="2")
    with pytest.raises(TypeError, match="built from a ModelConfig .*not a TrainConfig"):
        train_run(TrainConfig(), PRESETS["tiny"], tmp_path / "run")
    with pytest.raises(TypeError, match="training settings are a TrainConfig .*not a dict"):
        train_run(PRESETS["tiny"], {"max_steps": 1}, tmp_path / "run")
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # nothing made


def test_the_exports_take_a_folder_and_a_true_or_false_force(tmp_path):
    """Found by an interop hunt: a Transformer given for its folder was pathlib's "expected str,
    bytes or os.PathLike object", and force="no", a true string, replaced the output."""
    from aiayn.ct2 import export_argos, export_ct2
    from aiayn.marian import export_marian

    folder = make_model(tmp_path / "model")
    with pytest.raises(TypeError, match=r"the path of a model or run folder, not a Transformer \(save it first"):
        export_ct2(Transformer.load(folder), tmp_path / "ct2")
    (tmp_path / "pkg.argosmodel").write_bytes(b"mine")
    with pytest.raises(TypeError, match="force is True or False, not 'no'"):
        export_argos(folder, tmp_path / "pkg.argosmodel", "en", "es", force="no")
    with pytest.raises(TypeError, match="force is True or False, not 1"):
        export_marian(folder, tmp_path / "hf", force=1)
    assert (tmp_path / "pkg.argosmodel").read_bytes() == b"mine" and not (tmp_path / "ct2").exists()
    # Transformer.load of a model, a missing folder or a file (found by a misuse hunt: pathlib's TypeError,
    # and "no config.json in nope" of a folder that is not there)
    with pytest.raises(TypeError, match=r"the path of a model folder, not a Transformer \(save it first"):
        Transformer.load(Transformer.load(folder))
    with pytest.raises(FileNotFoundError, match="no such folder: nope"):
        Transformer.load("nope")
    with pytest.raises(FileNotFoundError, match="pkg.argosmodel is a file, not a model folder"):
        Transformer.load(tmp_path / "pkg.argosmodel")
    make_model(tmp_path / "new")  # a folder of model folders points at model/ first, as a run's does
    with pytest.raises(FileNotFoundError, match=f"it holds one, {tmp_path / 'model'} "):
        Transformer.load(tmp_path)


def test_a_misuse_hunts_mistakes_are_said_before_any_work(tmp_path):
    """Found by a misuse hunt: None among sentences (None was the check's own sentinel), a path
    where score takes a Translator (str.translate's TypeError), a None reference (an AttributeError
    after the whole decoding), n_best=2.0 (a slice's TypeError after the search), chunk_lines=0
    (a loop for ever), decode= in stream (a TypeError of 'multiple values'), a DecodeConfig or None
    as Translator.load's device (torch.device's TypeError of many lines), None as an output folder
    (pathlib's), and translator.model.save (a folder without the laid-out weights)."""
    from aiayn.config import DecodeConfig

    folder = make_model(tmp_path / "model")
    translator = Translator.load(folder, "cpu")
    with pytest.raises(TypeError, match="a list of strings, not of NoneType"):
        translator.translate(["the cat", None])
    with pytest.raises(TypeError, match=r"score takes a Translator, not a str: score\(Translator.load\("):
        score(str(folder), [("the cat", "el gato")])
    seen = []
    translator.translate_ids = lambda *args, **kwargs: seen.append(1)
    with pytest.raises(TypeError, match="pairs of two strings; pair 1 is"):
        score(translator, [("the cat", "el gato"), ("the cat", None)])
    assert not seen
    del translator.translate_ids
    with pytest.raises(TypeError, match="n_best takes a whole number, not 2.0"):
        translator.translate_nbest([[5, 6]], 2.0)
    with pytest.raises(ValueError, match="chunk_lines must be at least 1, got 0"):
        translator.stream(["the cat"], print, chunk_lines=0)
    with pytest.raises(TypeError, match=r"give a call's changes as keywords"):
        translator.stream(["the cat"], print, decode=DecodeConfig(beam=2))
    with pytest.raises(TypeError, match="lines are strings, not NoneType"):
        translator.stream([None], print)
    with pytest.raises(TypeError, match=r"the second argument of Translator.load is the device"):
        Translator.load(folder, DecodeConfig(beam=1))
    with pytest.raises(TypeError, match="device takes a name .* not a NoneType"):
        Translator.load(folder, None)
    with pytest.raises(TypeError, match="give the path of the output folder, not a NoneType"):
        average_checkpoints([folder], None)
    with pytest.raises(ValueError, match=r"a decoding copy in fp32 \(Translator.model\)"):
        translator.model.save(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
