"""HF Marian (OPUS-MT) import and export, checked against transformers and CTranslate2 on a small
random `MarianMTModel` built from a `MarianConfig` (nothing is downloaded).

Where the searches coincide they must agree token for token: greedy always; beam search with no
length normalisation (aiayn α = 0, HF length_penalty = 0), since aiayn divides by GNMT's
((5 + |Y|) / 6)^α (§6.1) and HF by |Y|^α.
"""

import dataclasses
import importlib.util
import json
import re
import subprocess
import sys

import pytest
import sentencepiece as spm
import torch

transformers = pytest.importorskip("transformers", reason="the `marian` extra (transformers) is not installed")

from aiayn.config import DECODE_PRESETS, ModelConfig  # noqa: E402
from aiayn.marian import BARRED_LOGIT, PAD_PIECE, export_marian, import_marian  # noqa: E402
from aiayn.model import Transformer  # noqa: E402
from aiayn.search import beam_search, greedy  # noqa: E402
from aiayn.translate import ModelStep  # noqa: E402
from aiayn.tokenizer import MarianTokenizer, Tokenizer  # noqa: E402

TEXT = [
    "the cat sat on the mat", "a dog ran in the park", "the house is small and warm",
    "we read books at night", "she writes letters to her friends", "the river flows to the sea",
] * 20


def write_marian_tokenizer(directory):
    """source.spm, target.spm and a vocab.json laid out as Marian's: </s> 0, <unk> 1, ..., <pad> last."""
    for name in ("source", "target"):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(TEXT), model_prefix=str(directory / name), vocab_size=40,
            model_type="bpe", minloglevel=2, num_threads=1,
        )
        (directory / f"{name}.model").rename(directory / f"{name}.spm")
    sp = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    pieces = ["</s>", "<unk>", ">>es<<"] + [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    return len(vocab)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return random_marian(tmp_path_factory.mktemp("opus-mt-tiny"))


def random_marian(directory, **changes):
    """A random MarianMTModel of OPUS-MT's options (but `changes`) saved in `directory`, with its tokenizer."""
    vocab_size = write_marian_tokenizer(directory)
    config = transformers.MarianConfig(**{
        "vocab_size": vocab_size, "decoder_vocab_size": vocab_size, "d_model": 32, "encoder_layers": 2,
        "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "activation_function": "swish", "scale_embedding": True, "max_position_embeddings": 128,
        "pad_token_id": vocab_size - 1, "eos_token_id": 0, "decoder_start_token_id": vocab_size - 1,
        "forced_eos_token_id": 0, **changes})
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        # Larger weights than HF's init (std 0.02), whose outputs hardly depend on the input.
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5)
            else:  # biases and LayerNorms: at HF's 0 and 1, one imported into another's place showed nothing
                p.add_(0.2 * torch.randn_like(p))  # (found by mutation: two norms or two biases swapped passed)
        model.model.shared.weight[vocab_size - 1] = 0  # the pad row, where decoding starts
        model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    model_dir = import_marian(hf_dir, out, echo=lambda _: None)
    return out, Transformer.load(model_dir).eval()


def hf_model(directory):
    return transformers.MarianMTModel.from_pretrained(directory).eval()


def sources(vocab_size, eos):
    torch.manual_seed(1)
    rows = [torch.randint(3, vocab_size - 1, (n,)).tolist() + [eos] for n in (7, 4, 9)]
    width = max(map(len, rows))
    pad = vocab_size - 1
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows]), pad


def test_config_maps_marian_options(imported):
    _, model = imported
    c = model.config
    assert (c.positional, c.activation, c.final_logits_bias, c.layer_norm_eps) == ("sinusoidal_concat", "swish", True, 1e-5)
    assert c.bos_id == c.pad_id == c.vocab_size - 1 and c.eos_id == 0 and c.unk_id == 1
    assert ModelConfig().positional == "sinusoidal" and not ModelConfig().final_logits_bias  # the paper's defaults


def test_logits_equal_hf(hf_dir, imported):
    _, model = imported
    reference = hf_model(hf_dir)
    src, pad = sources(model.config.vocab_size, 0)
    tgt = torch.cat([torch.full((3, 1), pad), torch.randint(3, pad, (3, 6))], dim=1)
    with torch.no_grad():
        expected = reference(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(model(src, tgt), expected, atol=1e-4, rtol=1e-4)


def test_greedy_equals_generate(hf_dir, imported):
    _, model = imported
    reference = hf_model(hf_dir)
    src, pad = sources(model.config.vocab_size, 0)
    limit = 12
    with torch.no_grad():
        out = reference.generate(
            input_ids=src, attention_mask=(src != pad).long(), num_beams=1, do_sample=False,
            max_new_tokens=limit, forced_eos_token_id=None,
        )
    expected = [[t for t in row[1:].tolist() if t not in (0, pad)] for row in out]
    step = ModelStep(model, src, limit + 1)
    got = greedy(step.step, step.reorder, model.config.bos_id, model.config.eos_id, torch.full((3,), limit))
    assert got == expected
    assert len({tuple(e) for e in expected}) == 3  # the outputs depend on the input


def test_beam_search_equals_generate_without_length_penalty(hf_dir, imported):
    _, model = imported
    reference = hf_model(hf_dir)
    src, pad = sources(model.config.vocab_size, 0)
    with torch.no_grad():
        out = reference.generate(
            input_ids=src, attention_mask=(src != pad).long(), num_beams=4, do_sample=False,
            max_new_tokens=40, length_penalty=0.0, early_stopping=True, forced_eos_token_id=None,
        )
    expected = [[t for t in row[1:].tolist() if t not in (0, pad)] for row in out]
    step = ModelStep(model, src, 41)
    hypotheses = beam_search(step.step, step.reorder, model.config.bos_id, 0, torch.full((3,), 40), beam=4, alpha=0.0)
    assert [h.tokens for h in hypotheses] == expected


def test_tokenizer_matches_hf(hf_dir, imported):
    out, _ = imported
    ours = MarianTokenizer.load(out / "model")
    theirs = transformers.MarianTokenizer.from_pretrained(hf_dir)
    for text in ["the cat sat on the mat", ">>es<< a dog in the house", "zebra quiz"]:
        assert ours.encode(text) + [ours.eos_id] == theirs(text)["input_ids"]
    ids = ours.encode("the river flows")
    assert ours.decode(ids + [ours.eos_id, ours.pad_id]) == theirs.decode(ids, skip_special_tokens=True)


def test_export_of_an_import_gives_hf_the_same_logits(hf_dir, imported, tmp_path):
    out, model = imported
    export_marian(out, tmp_path / "hf", echo=lambda _: None)
    src, pad = sources(model.config.vocab_size, 0)
    tgt = torch.cat([torch.full((3, 1), pad), torch.randint(3, pad, (3, 5))], dim=1)
    with torch.no_grad():
        original = hf_model(hf_dir)(input_ids=src, decoder_input_ids=tgt, attention_mask=(src != pad).long()).logits
        exported = hf_model(tmp_path / "hf")(input_ids=src, decoder_input_ids=tgt, attention_mask=(src != pad).long()).logits
    torch.testing.assert_close(exported, original, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("share", [True, False])
def test_export_of_a_native_model_is_exact(tmp_path, share):
    """A model trained with aiayn (interleaved sinusoids, its own tokenizer) exports exactly: the
    residual stream is re-indexed so that Marian's [sin | cos] positions fit (aiayn.marian). Unshared
    embeddings export without Marian's shared table, which transformers would call unexpected."""
    tokenizer = Tokenizer.train(TEXT, 300, tmp_path / "model")
    config = ModelConfig(vocab_size=300, d_model=16, n_heads=4, d_ff=32, n_layers=2, layer_norm_eps=1e-5, dropout=0.0,
                         share_embeddings=share, tie_output=share, max_len=32)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    with torch.no_grad():  # a trained model's biases and norms (found by mutation: those the re-indexing
        for p in model.parameters():  # of the residual stream left out passed at their initial 0 and 1)
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model.save(tmp_path / "model")
    notes = []
    export_marian(tmp_path / "model", tmp_path / "hf", echo=notes.append)
    assert any("CTranslate2" in n for n in notes)  # BOS has a learned embedding: the user is told
    src = torch.tensor([tokenizer.encode("the cat sat") + [2]])
    tgt = torch.tensor([[1] + tokenizer.encode("a dog")])
    with torch.no_grad():
        expected = model(src, tgt)
        theirs, loading = transformers.MarianMTModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
        got = theirs.eval()(input_ids=src, decoder_input_ids=tgt).logits
    assert not loading["unexpected_keys"] and not loading["missing_keys"], loading
    # The export's one extra row is Marian's <pad>, which CTranslate2 drops (aiayn.marian); aiayn's
    # own pad, which CTranslate2 keeps, is barred by the logits bias as aiayn's search bars it.
    assert got.size(-1) == config.vocab_size + 1
    tokens = [i for i in range(config.vocab_size) if i != config.pad_id]
    torch.testing.assert_close(got[..., tokens], expected[..., tokens], atol=1e-4, rtol=1e-4)
    assert torch.all(got[..., config.pad_id] <= BARRED_LOGIT + expected[..., config.pad_id].abs() + 1e-3)
    theirs = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    assert theirs("the cat sat")["input_ids"] == src[0].tolist()
    # Marian's <pad> row is zero (a model of BOS = pad starts decoding from it), and transformers'
    # generate() decodes as aiayn: §6.1's beam, no EOS at the first step, neither pad ever (found
    # by mutation: a row of ones, min_new_tokens 0 and aiayn's pad allowed each passed every test).
    from safetensors.torch import load_file

    table = [tensor for name, tensor in load_file(str(tmp_path / "hf" / "model.safetensors")).items()
             if name.endswith("embed_tokens.weight") or name == "model.shared.weight"]
    assert table and all(not tensor[-1].any() for tensor in table)
    generation = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
    assert (generation.num_beams, generation.min_new_tokens) == (DECODE_PRESETS["translate"].beam,
                                                                 DECODE_PRESETS["translate"].min_len)
    assert sorted(generation.bad_words_ids) == [[config.pad_id], [config.vocab_size]]
    # A line longer than max_len, which aiayn translates (its sinusoids go on), runs in transformers too
    # (found in review: an IndexError, its position table being max_len long)
    long = torch.tensor([tokenizer.encode("the cat sat " * 40)[: config.max_len + 20] + [2]])
    assert long.size(1) > config.max_len  # (found by mutation: at the default max_len the line fell short of it)
    with torch.no_grad():
        torch.testing.assert_close(transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()(
            input_ids=long, decoder_input_ids=tgt).logits[..., tokens], model(long, tgt)[..., tokens], atol=1e-4, rtol=1e-4)


def test_export_to_ctranslate2_gives_the_same_greedy_tokens(imported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the `marian` extra (ctranslate2) is not installed")
    out, model = imported
    # export-ct2 and export-argos write one SentencePiece model: Marian's two are refused, by
    # export-argos before it asks for languages (found by an interop hunt: asked, then refused).
    from aiayn.ct2 import export_argos, export_ct2

    for export in (lambda: export_ct2(out, tmp_path / "direct"), lambda: export_argos(out, tmp_path / "p.argosmodel")):
        with pytest.raises(ValueError, match="^this model has Marian's two SentencePiece models: export it with export-hf"):
            export()
    assert not (tmp_path / "direct").exists() and not (tmp_path / "p.argosmodel").exists()
    export_marian(out, tmp_path / "hf", echo=lambda _: None)
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    tokenizer = MarianTokenizer.load(out / "model")
    src, pad = sources(model.config.vocab_size, 0)
    limit = 12
    step = ModelStep(model, src, limit + 1)
    ours = greedy(step.step, step.reorder, model.config.bos_id, model.config.eos_id, torch.full((3,), limit))
    pieces = [[tokenizer.id_to_piece(t) for t in row.tolist() if t != pad] for row in src]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=limit, min_decoding_length=0)
    theirs = [[tokenizer.vocab[p] for p in r.hypotheses[0]] for r in results]
    assert theirs == ours
    assert len({tuple(o) for o in ours}) == 3


def native_model(folder, seed: int):
    """A model trained by aiayn (its own tokenizer, <pad> first) whose BOS is the pad token: a
    zero start, as CTranslate2 starts a Marian decoder. Thirty Adam steps with label smoothing
    train it: the tied pre-softmax projection must leave the pad row at zero. Saved in `folder`."""
    from aiayn.loss import label_smoothed_nll

    tokenizer = Tokenizer.train(TEXT, 300, folder)
    config = ModelConfig(vocab_size=300, d_model=16, n_heads=4, d_ff=32, n_layers=2, layer_norm_eps=1e-5, dropout=0.0,
                         bos_id=0)
    torch.manual_seed(seed)
    model = Transformer(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = [tokenizer.encode(line) for line in TEXT[:8]]
    width = max(map(len, ids)) + 1
    src = torch.tensor([row + [config.eos_id] + [config.pad_id] * (width - len(row) - 1) for row in ids])
    tgt_in = torch.cat([torch.zeros(len(ids), 1, dtype=torch.long), src[:, :-1]], dim=1)  # BOS = pad, then the copy
    for _ in range(30):  # enough to copy: distinct sentences, distinct outputs
        logits = model(src, tgt_in)
        loss, _ = label_smoothed_nll(logits.flatten(0, 1), src.flatten(), 0.1, config.pad_id)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(model.decoder.embed.weight[config.pad_id], torch.zeros(16))
    model.eval().save(folder)
    return model, tokenizer


def test_a_native_model_converts_to_ctranslate2_and_gives_the_same_greedy_tokens(tmp_path):
    """A model trained by aiayn (its tokenizer has <pad> first) converts with CTranslate2's own
    converter, and with BOS = pad (a zero start, as CTranslate2 starts) greedy decoding agrees."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the `marian` extra (ctranslate2) is not installed")
    model, tokenizer = native_model(tmp_path / "model", seed=1)
    config = model.config
    export_marian(tmp_path / "model", tmp_path / "hf", echo=lambda _: None)
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    sentences = ["the cat sat", "a dog ran far", "the bird"]
    limit = 12
    ours = []
    for sentence in sentences:
        src = torch.tensor([tokenizer.encode(sentence) + [config.eos_id]])
        step = ModelStep(model, src, limit + 1)
        ours += greedy(step.step, step.reorder, config.bos_id, config.eos_id, torch.full((1,), limit))
    pieces = [[tokenizer.id_to_piece(i) for i in tokenizer.encode(s)] + ["</s>"] for s in sentences]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=limit, min_decoding_length=0)
    vocab = json.loads((tmp_path / "hf" / "vocab.json").read_text())
    assert [[vocab[p] for p in r.hypotheses[0]] for r in results] == ours
    # CTranslate2 keeps aiayn's pad as a token (it drops only Marian's): it gets no probability
    (scored,) = translator.score_batch([pieces[0]], [[PAD_PIECE]])
    assert scored.log_probs[0] < BARRED_LOGIT / 2
    assert len({tuple(o) for o in ours}) == 3
    # transformers: the same tokens and, decoded, the same text: its start token is no text
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    for sentence, tokens in zip(sentences, ours):
        batch = hf_tokenizer([sentence], return_tensors="pt")
        # one token more: at its last, generate forces EOS (forced_eos_token_id), where aiayn stops
        generated = hf_model(tmp_path / "hf").generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit + 1)
        assert generated[0, 1:len(tokens) + 1].tolist() == tokens
        assert hf_tokenizer.decode(generated[0], skip_special_tokens=True) == tokenizer.decode(tokens)


def test_cli_import_translate_export(hf_dir, tmp_path):
    def aiayn(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "aiayn", *args], input=stdin, capture_output=True, text=True)

    done = aiayn("import-hf", str(hf_dir), str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    translated = aiayn("translate", str(tmp_path / "run"), "--beam", "2", stdin="the cat sat\nthe river\n")
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 2
    assert aiayn("export-hf", str(tmp_path / "run"), str(tmp_path / "hf")).returncode == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    bad = aiayn("import-hf", str(tmp_path / "run"), str(tmp_path / "x"))  # an aiayn folder, not HF
    assert bad.returncode == 2 and bad.stderr.startswith("aiayn: error:") and len(bad.stderr.splitlines()) == 1


def copy_with_config(hf_dir, folder, **change):
    """The HF folder `hf_dir` copied to `folder` with its config.json changed."""
    folder.mkdir()
    for name in ("source.spm", "target.spm", "vocab.json", "model.safetensors"):
        (folder / name).write_bytes((hf_dir / name).read_bytes())
    (folder / "config.json").write_text(json.dumps({**json.loads((hf_dir / "config.json").read_text()), **change}))
    return folder


def test_position_tables_in_the_weights_must_be_the_sinusoids(hf_dir, tmp_path):
    """transformers loads a position table from the weights over the sinusoids it computes; aiayn
    computes the sinusoids, so a table that is not them is refused (found by an interop hunt: a
    learned table was dropped without a word, and every output differed from transformers')."""
    from safetensors.torch import load_file, save_file

    own = transformers.MarianMTModel.from_pretrained(hf_dir).model.encoder.embed_positions.weight.detach().clone()
    for name, table, refused in (("sinusoids", own, False), ("bf16", own.bfloat16(), False),
                                 ("learned", own + 0.05 * torch.randn_like(own), True)):
        folder = copy_with_config(hf_dir, tmp_path / name)
        weights = load_file(str(folder / "model.safetensors"))
        weights.update({f"model.{side}.embed_positions.weight": table.clone() for side in ("encoder", "decoder")})
        save_file(weights, str(folder / "model.safetensors"))
        if refused:
            with pytest.raises(ValueError, match="embed_positions.weight, which is not the sinusoids Marian computes"):
                import_marian(folder, tmp_path / f"out-{name}", echo=lambda _: None)
            assert not (tmp_path / f"out-{name}").exists()
        else:
            model = Transformer.load(import_marian(folder, tmp_path / f"out-{name}", echo=lambda _: None)).eval()
            src, tgt = torch.tensor([[5, 9, 14, 0]]), torch.tensor([[model.config.bos_id, 7, 3]])
            with torch.no_grad():
                expected = transformers.MarianMTModel.from_pretrained(folder).eval()(input_ids=src, decoder_input_ids=tgt).logits
                torch.testing.assert_close(model(src, tgt), expected, atol=2e-2 if name == "bf16" else 1e-4, rtol=1e-3)


def test_a_sharded_folder_imports_as_the_whole_one(hf_dir, imported, tmp_path):
    """Weights in shards, as transformers saves a large model (`model.safetensors.index.json`):
    found by an interop hunt, they were said to be missing."""
    sharded = tmp_path / "sharded"
    transformers.MarianMTModel.from_pretrained(hf_dir).save_pretrained(sharded, max_shard_size="20KB")
    for name in ("source.spm", "target.spm", "vocab.json"):
        (sharded / name).write_bytes((hf_dir / name).read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("model-*.safetensors"))) > 1
    model = Transformer.load(import_marian(sharded, tmp_path / "out", echo=lambda _: None)).eval()
    src, tgt = torch.tensor([[5, 9, 14, 0]]), torch.tensor([[model.config.bos_id, 7, 3]])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), imported[1](src, tgt), atol=0, rtol=0)
    next(sharded.glob("model-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="cannot read .*model-"):
        import_marian(sharded, tmp_path / "out2", echo=lambda _: None)


def test_unshared_tables_with_a_tied_output_export_and_import_back(tmp_path):
    """Found by an interop hunt: the export of unshared tables with a tied output wrote lm_head,
    a copy of the decoder's table, which the import then refused as weights of another model."""
    Tokenizer.train(TEXT, 300, tmp_path / "model")
    config = ModelConfig(vocab_size=300, d_model=16, n_heads=4, d_ff=32, n_layers=2, layer_norm_eps=1e-5, dropout=0.0,
                         share_embeddings=False, tie_output=True, max_len=32, bos_id=0)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    model.save(tmp_path / "model")
    export_marian(tmp_path / "model", tmp_path / "hf", echo=lambda _: None)
    back = Transformer.load(import_marian(tmp_path / "hf", tmp_path / "back", echo=lambda _: None)).eval()
    src, tgt = torch.tensor([[5, 9, 14, 2]]), torch.tensor([[0, 7, 3]])
    tokens = [i for i in range(config.vocab_size) if i != config.pad_id]
    with torch.no_grad():
        torch.testing.assert_close(back(src, tgt)[..., tokens], model(src, tgt)[..., tokens], atol=1e-4, rtol=1e-4)


def test_unscaled_embeddings_import_equal_hf(hf_dir, tmp_path):
    """MarianConfig's default, scale_embedding false, skips §3.4's √d_model: the logits follow HF's."""
    folder = copy_with_config(hf_dir, tmp_path / "unscaled", scale_embedding=False)
    model = Transformer.load(import_marian(folder, tmp_path / "out", echo=lambda _: None)).eval()
    assert not model.config.scale_embedding and ModelConfig().scale_embedding
    src, pad = sources(model.config.vocab_size, 0)
    tgt = torch.cat([torch.full((3, 1), pad), torch.randint(3, pad, (3, 6))], dim=1)
    with torch.no_grad():
        expected = hf_model(folder)(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
        scaled = hf_model(hf_dir)(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(model(src, tgt), expected, atol=1e-4, rtol=1e-4)
    assert (expected - scaled).abs().max() > 0.1  # the switch changes the model


def test_a_shared_but_untied_marian_imports_with_the_tables_transformers_computes_with(tmp_path):
    """share_encoder_decoder_embeddings with tie_word_embeddings false: transformers 5 keeps the
    encoder's and decoder's tables apart from `shared` and computes with them (found in review:
    refused as "weights its config.json does not describe"). Imported unshared and untied, the
    logits are transformers'."""
    folder = tmp_path / "untied"
    folder.mkdir()
    random_marian(folder, tie_word_embeddings=False)
    reference = hf_model(folder)
    vocab_size = reference.config.vocab_size
    tables = [reference.model.shared.weight, reference.model.encoder.embed_tokens.weight,
              reference.model.decoder.embed_tokens.weight]
    if all(torch.equal(table, tables[0]) for table in tables):
        pytest.skip(f"transformers {transformers.__version__} ties the tables to `shared` whatever tie_word_embeddings says")
    imported = Transformer.load(import_marian(folder, tmp_path / "out", echo=lambda _: None)).eval()
    assert not imported.config.share_embeddings and not imported.config.tie_output
    src, pad = sources(vocab_size, 0)
    tgt = torch.cat([torch.full((3, 1), pad), torch.randint(3, pad, (3, 6))], dim=1)
    with torch.no_grad():
        expected = reference(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(imported(src, tgt), expected, atol=1e-4, rtol=1e-4)
    # Its decoder's pad row is not zero: exported, it is told so, but not to retrain a model aiayn
    # did not train (found by an interop hunt)
    notes = []
    export_marian(tmp_path / "out", tmp_path / "back", echo=notes.append)
    (note,) = [n for n in notes if "starts from BOS's learned embedding" in n]
    assert "retrain" not in note and "--bos-id" not in note


def test_a_marian_model_folder_without_lm_head_and_a_null_decoder_start_import_as_transformers_loads_them(hf_dir, tmp_path):
    """Found in review: a folder saved from MarianModel (keys without "model.", which
    transformers adds) was refused; so was `"decoder_start_token_id": null` (this transformers
    refuses it too; older configs hold it: decoding starts at the pad token, as MarianConfig's
    default has it)."""
    base = tmp_path / "base"
    hf_model(hf_dir).model.save_pretrained(base)  # the MarianModel inside: no lm_head, no final_logits_bias
    for name in ("source.spm", "target.spm", "vocab.json"):
        (base / name).write_bytes((hf_dir / name).read_bytes())
    model = Transformer.load(import_marian(base, tmp_path / "out", echo=lambda _: None)).eval()
    src, pad = sources(model.config.vocab_size, 0)
    tgt = torch.cat([torch.full((3, 1), pad), torch.randint(3, pad, (3, 6))], dim=1)
    with torch.no_grad():
        expected = hf_model(base)(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(model(src, tgt), expected, atol=1e-4, rtol=1e-4)
    null = copy_with_config(hf_dir, tmp_path / "null", decoder_start_token_id=None)
    config = Transformer.load(import_marian(null, tmp_path / "null-out", echo=lambda _: None)).config
    assert config.bos_id == config.pad_id == transformers.MarianConfig.from_pretrained(hf_dir).pad_token_id


def test_unsupported_marian_options_are_refused(hf_dir, tmp_path):
    with pytest.raises(ValueError, match="depths differ"):
        import_marian(copy_with_config(hf_dir, tmp_path / "depths", decoder_layers=1), tmp_path / "out", echo=lambda _: None)
    eos = json.loads((hf_dir / "config.json").read_text())["eos_token_id"]  # (an interop hunt: in ModelConfig's terms)
    with pytest.raises(ValueError, match=f"not supported: decoder_start_token_id {eos} is its eos_token_id"):
        import_marian(copy_with_config(hf_dir, tmp_path / "start", decoder_start_token_id=eos), tmp_path / "out",
                      echo=lambda _: None)
    with pytest.raises(ValueError, match="no learned positions"):
        export_marian_config = dataclasses.replace(ModelConfig(vocab_size=300), positional="learned")
        from aiayn.marian import marian_config

        marian_config(export_marian_config)
    # d_k = d_v = d_model // h, but h · d_k is not d_model: transformers refuses to load such a
    # folder, and import-hf its own export (found by an interop hunt: written, exit 0)
    with pytest.raises(ValueError, match="Marian needs d_k = d_v = d_model / h"):
        marian_config(ModelConfig(vocab_size=300, d_model=30, n_heads=4, d_k=7, d_v=7))


def test_an_hf_folder_that_aiayn_cannot_read_is_refused_in_one_line(hf_dir, tmp_path):
    """A target vocabulary of its own (it would decode target ids through the source's pieces),
    weights of other shapes than config.json says, and a vocab.json that is not a piece -> id map."""
    separate = copy_with_config(hf_dir, tmp_path / "separate")
    (separate / "target_vocab.json").write_bytes((hf_dir / "vocab.json").read_bytes())  # as HF's tokenizer saves one
    with pytest.raises(ValueError, match="target vocabulary of its own"):
        import_marian(separate, tmp_path / "out", echo=lambda _: None)
    wider = copy_with_config(hf_dir, tmp_path / "wider", d_model=2 * json.loads((hf_dir / "config.json").read_text())["d_model"])
    with pytest.raises(ValueError, match="do not fit its config.json: size mismatch for ") as refused:
        import_marian(wider, tmp_path / "out", echo=lambda _: None)
    assert "\n" not in str(refused.value)
    # found in review: tracebacks for a size that is a string, an activation that is a list, 0 heads; a run
    # written that no command loads for special ids other than vocab.json's; a layer dropped without a word
    depth = json.loads((hf_dir / "config.json").read_text())["encoder_layers"]
    for change, says in [({"d_model": "32"}, "d_model '32' must be whole numbers"),
                         ({"activation_function": ["swish"]}, "activation ['swish']"),
                         ({"encoder_attention_heads": 0, "decoder_attention_heads": 0}, "encoder_attention_heads 0"),
                         ({"eos_token_id": 7}, "vocab.json and config.json disagree"),
                         ({"encoder_layers": depth - 1, "decoder_layers": depth - 1}, "weights its config.json does not describe")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            import_marian(copy_with_config(hf_dir, tmp_path / f"c{len(says)}", **change), tmp_path / "out",
                          echo=lambda _: None)
    listed = copy_with_config(hf_dir, tmp_path / "listed")
    (listed / "vocab.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match="must map each piece to its id"):
        import_marian(listed, tmp_path / "out", echo=lambda _: None)
    empty = copy_with_config(hf_dir, tmp_path / "empty")  # found in review: imported, then a traceback at the first encode
    (empty / "target.spm").write_bytes(b"")
    with pytest.raises(ValueError, match="holds a broken SentencePiece model: target.spm is empty"):
        import_marian(empty, tmp_path / "out", echo=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_preprocess_takes_the_tokenizer_of_an_imported_run_folder(imported, tmp_path):
    """`preprocess --tokenizer RUN` with the folder import-hf wrote (its tokenizer in RUN/model, as
    `train --init-from RUN` finds it; found in review: "is no folder holding a tokenizer")."""
    from aiayn.store import load_store, tokenizer_digest

    out, _ = imported
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("".join(f"{s}\t{s[::-1]}\n" for s in TEXT[:6]) * 4)
    done = subprocess.run([sys.executable, "-m", "aiayn", "preprocess", "--corpus", str(corpus), "--tokenizer", str(out),
                           "--out", str(tmp_path / "data")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert load_store(tmp_path / "data").manifest["tokenizer_sha256"] == tokenizer_digest(out / "model")


def test_fine_tune_an_imported_model(imported, tmp_path):
    """`aiayn train --init-from RUN` starts from the imported weights and tokenizer (§5's recipe)."""
    out, model = imported
    corpus = tmp_path / "pairs.tsv"
    corpus.write_text("".join(f"{s}\t{s[::-1]}\n" for s in TEXT[:6]) * 4)
    run = tmp_path / "ft"
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", "train", "--init-from", str(out), "--corpus", str(corpus), "--out", str(run),
         "--max-steps", "2", "--max-tokens", "200", "--warmup-steps", "10", "--eval-every", "100", "--save-every", "2",
         "--lr-scale", "0.01"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "starting from the weights of" in done.stdout
    tuned = Transformer.load(run / "model")
    assert tuned.config == model.config
    assert MarianTokenizer.is_in(run / "model") and MarianTokenizer.is_in(run / "checkpoints" / "step_00000002")
    before, after = model.state_dict(), tuned.state_dict()
    change = max((after[k] - before[k]).abs().max().item() for k in before)
    assert 0 < change < 0.05  # two small steps away from the imported weights, not a fresh model


def test_a_model_and_tokenizer_of_other_sizes_are_refused_by_every_export_and_by_import(hf_dir, tmp_path):
    """Found in review: export-ct2 raised an IndexError for a model of more rows than its tokenizer
    has pieces and wrote one of fewer; export-hf padded with a real token; import-hf took a
    vocab.json smaller than the model, which `aiayn translate` then refused."""
    from aiayn.ct2 import export_ct2

    for rows in (304, 296):
        folder = tmp_path / f"rows-{rows}"
        folder.mkdir()
        Tokenizer.train(TEXT, 300, folder)
        Transformer(ModelConfig(vocab_size=rows, d_model=16, n_heads=4, d_ff=32, n_layers=1)).save(folder)
        with pytest.raises(ValueError, match=f"the tokenizer has 300 tokens, the model {rows}"):
            export_marian(folder, tmp_path / f"hf-{rows}", echo=lambda _: None)
        if importlib.util.find_spec("ctranslate2") is not None:  # the `marian` extra
            with pytest.raises(ValueError, match=f"the tokenizer has 300 tokens, the model {rows}"):
                export_ct2(folder, tmp_path / f"ct2-{rows}", echo=lambda _: None)
        assert not (tmp_path / f"hf-{rows}").exists() and not (tmp_path / f"ct2-{rows}").exists()
    rows = json.loads((hf_dir / "config.json").read_text())["vocab_size"] + 4
    larger = copy_with_config(hf_dir, tmp_path / "larger", vocab_size=rows, decoder_vocab_size=rows)
    with pytest.raises(ValueError, match=f"vocab.json and config.json disagree: the tokenizer has {rows - 4} tokens, the model {rows}"):
        import_marian(larger, tmp_path / "out", echo=lambda _: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("changes", [{}, {"scale_embedding": False}, {"share_embeddings": False, "tie_output": False},
                                     {"activation": "gelu", "dropout": 0.3, "attention_dropout": 0.1}])
def test_the_config_an_export_writes_reads_back_as_the_model(changes):
    """Every setting an exported config.json states comes back on import (found by mutation: an
    export that always wrote scale_embedding true passed, as every export test's model scaled)."""
    from aiayn.marian import config_from_marian, marian_config

    config = ModelConfig(vocab_size=60, d_model=16, n_heads=2, d_ff=32, n_layers=2, positional="sinusoidal_concat",
                         final_logits_bias=True, layer_norm_eps=1e-5, attention_bias=True, **changes)
    back = config_from_marian({**marian_config(config), "model_type": "marian"}, config.unk_id)
    assert dataclasses.replace(back, max_len=config.max_len) == config  # sinusoids are exported longer (exported_positions)
    assert back.max_len >= config.max_len
    # A config.json without scale_embedding is read as transformers reads it (found by mutation: scaled)
    unsaid = {name: value for name, value in marian_config(config).items() if name != "scale_embedding"}
    assert config_from_marian({**unsaid, "model_type": "marian"}, config.unk_id).scale_embedding is \
        transformers.MarianConfig().scale_embedding is False
