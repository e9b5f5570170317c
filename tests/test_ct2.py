"""aiayn models written as CTranslate2 models (aiayn.ct2), checked against CTranslate2 itself:
the same log-probabilities of a target, token by token, and the same greedy tokens, for pre-norm
and post-norm models, each kind of positions, tied and untied projections, BOS as the decoder's
start; and the Argos Translate package LibreTranslate installs."""

import json
import math
import shlex
import subprocess
import sys
import zipfile

import pytest
import torch

from aiayn.config import ModelConfig
from aiayn.ct2 import export_argos, export_ct2, transformer_spec
from aiayn.model import Transformer
from aiayn.search import greedy
from aiayn.tokenizer import Tokenizer
from aiayn.translate import ModelStep, translate_ids
from test_faults import cli, make_model, one_line_error

ctranslate2 = pytest.importorskip("ctranslate2", reason="the `marian` extra (ctranslate2) is not installed")

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "we read books at night"]
LIMIT = 10  # output tokens at most
# The decisions compared must not hang on rounding: fp32 sums in another order differ by ~1e-6
# at these sizes, so every greedy choice here wins by far more.
DECISIVE = 1e-3

# Biases on the attention projections (ModelConfig.attention_bias, an imported Marian model's) in
# all but one case, which has §3.2.2's projections without.
CASES = {
    "pre-norm, interleaved sinusoids": {"norm_first": True, "attention_bias": True},
    "post-norm (§3.1), [sin | cos]": {"norm_first": False, "positional": "sinusoidal_concat", "attention_bias": True},
    "learned positions, swish, untied, logits bias, no attention biases": {
        "positional": "learned", "activation": "swish", "tie_output": False, "share_embeddings": False,
        "final_logits_bias": True},
    # (found by mutation: the embeddings always scaled, and ε 1e-5 for the model's, passed every case)
    "unscaled embeddings, another ε": {"scale_embedding": False, "layer_norm_eps": 1e-3, "attention_bias": True},
    # h · d_k short of d_model (d_k = d_model // h): what the Marian route refuses, CTranslate2 holds
    "4 heads of 7 in d_model 30": {"d_model": 30, "n_heads": 4, "d_k": 7, "d_v": 7, "activation": "gelu"},
}


def randomize_biases(model: Transformer) -> None:
    """A saved random model has zero biases and unit LayerNorms: give them values, so that a
    bias or a norm put in the wrong place shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.dim() == 1:
                tensor.add_(0.1 * torch.randn(tensor.shape, generator=g))


def word_logits(model: Transformer, src: list[int], out: list[int]) -> torch.Tensor:
    """aiayn's logits of every position of `out` + EOS given `src`, padding barred: (len(out) + 1, V)."""
    config = model.config
    with torch.no_grad():
        logits = model(torch.tensor([src + [config.eos_id]]), torch.tensor([[config.bos_id] + out]))[0]  # (T, V)
    logits[:, config.pad_id] = float("-inf")
    return logits


def log_probs_of(model: Transformer, src: list[int], out: list[int]) -> torch.Tensor:
    """aiayn's log-probability of each token of `out` + EOS given `src`."""
    log_probs = torch.log_softmax(word_logits(model, src, out), dim=-1)
    return log_probs.gather(1, torch.tensor(out + [model.config.eos_id])[:, None]).squeeze(1)


def fp32_translator(model: Transformer, pieces: list[str], folder):
    """CTranslate2's translator of `model` (its vocabulary `pieces`), converted into `folder`."""
    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return transformer_spec(model, pieces)

    Converter().convert(str(folder))
    return ctranslate2.Translator(str(folder), device="cpu", compute_type="float32")


@pytest.mark.parametrize("case", CASES)
def test_ctranslate2_computes_what_aiayn_computes(case, tmp_path):
    folder = make_model(tmp_path / "model", **CASES[case])
    model = Transformer.load(folder).eval()
    randomize_biases(model)
    tokenizer = Tokenizer.load(folder)
    pieces = [tokenizer.id_to_piece(i) for i in range(model.config.vocab_size)]
    translator = fp32_translator(model, pieces, tmp_path / "ct2")
    written = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert (written["unk_token"], written["layer_norm_epsilon"]) == (pieces[model.config.unk_id], model.config.layer_norm_eps)
    sources = tokenizer.encode_batch(SENTENCES)
    ours = []
    for src in sources:  # aiayn's greedy tokens, each choice decisive
        step = ModelStep(model, torch.tensor([src + [model.config.eos_id]]), LIMIT + 1)
        (tokens,) = greedy(step.step, step.reorder, model.config.bos_id, model.config.eos_id, torch.full((1,), LIMIT))
        ours.append(tokens)
        top = word_logits(model, src, tokens).topk(2, dim=-1).values
        assert (top[: len(tokens), 0] - top[: len(tokens), 1]).min() > DECISIVE  # the test is well posed
    # The source without EOS, as argostranslate passes it: CTranslate2 appends EOS (add_source_eos).
    text = [[pieces[i] for i in src] for src in sources]
    results = translator.translate_batch(text, beam_size=1, max_decoding_length=LIMIT, min_decoding_length=0)
    assert [[tokenizer.piece_to_id(p) for p in r.hypotheses[0]] for r in results] == ours
    assert len({tuple(o) for o in ours}) == len(ours)  # outputs that differ: the source is read
    scored = translator.score_batch(text, [[pieces[i] for i in out] for out in ours])
    for src, out, score in zip(sources, ours, scored):
        expected = log_probs_of(model, src, out)
        assert torch.allclose(torch.tensor(score.log_probs), expected, atol=1e-4), (score.log_probs, expected)


def test_without_a_length_penalty_ctranslate2_s_beam_search_finds_aiayn_s_best_hypothesis(tmp_path):
    """Beam 4 at α = 0 on both sides (CTranslate2's length_penalty=0): the same scores, summed
    log-probabilities, so the same best hypothesis wherever it wins by more than rounding and ends
    before the length limit (where CTranslate2 scores no EOS and aiayn does; with α the two
    penalties differ: the README says so). A bias toward EOS ends the random model's outputs."""
    folder = make_model(tmp_path / "model", final_logits_bias=True, attention_bias=True)
    model = Transformer.load(folder).eval()
    randomize_biases(model)
    with torch.no_grad():
        model.logits_bias.zero_()
        model.logits_bias[model.config.eos_id] = 1.5
    tokenizer = Tokenizer.load(folder)
    pieces = [tokenizer.id_to_piece(i) for i in range(model.config.vocab_size)]
    translator = fp32_translator(model, pieces, tmp_path / "ct2")
    words = " ".join(SENTENCES).split()
    texts = [" ".join(words[i:i + n]) for n in (2, 3, 5, 8) for i in range(0, len(words) - n, 3)]
    sources = tokenizer.encode_batch(texts)
    ours = translate_ids(model, sources, beam=4, alpha=0.0, min_len=1, max_output_len=LIMIT * 4)
    theirs = translator.translate_batch([[pieces[i] for i in src] for src in sources], beam_size=4, length_penalty=0.0,
                                        max_decoding_length=LIMIT * 4, min_decoding_length=1, num_hypotheses=2,
                                        return_scores=True)
    compared = 0
    for out, result in zip(ours, theirs):
        best, second = result.scores[0], result.scores[1] if len(result.scores) > 1 else -math.inf
        if len(out) < LIMIT * 4 and best - second > DECISIVE:
            assert [tokenizer.piece_to_id(p) for p in result.hypotheses[0]] == out
            compared += 1
    assert compared >= len(texts) // 2, (compared, len(texts))  # the test is well posed


def test_export_ct2_writes_a_folder_ctranslate2_loads_and_keeps_what_is_there(tmp_path, capsys):
    folder = make_model(tmp_path / "model", max_len=64)  # pre-norm: the Marian route refuses it
    out = tmp_path / "ct2"
    code, stdout, err = cli(capsys, "export-ct2", folder, out, "--quantization", "int8")
    assert code in (0, None), err
    assert (out / "model.bin").exists() and (out / "tokenizer.model").read_bytes() == (folder / "tokenizer.model").read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"
    # The weights stored in int8: loaded as stored, not converted on load (found by mutation: an
    # fp32 export passed, loaded with compute_type="int8")
    assert ctranslate2.Translator(str(out), device="cpu").compute_type.startswith("int8")
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="int8")
    assert translator.translate_batch([["▁the", "▁cat"]], max_decoding_length=4)[0].hypotheses
    # Past the model's max_len (a source aiayn translates): the sinusoids cover every position it decodes.
    assert translator.translate_batch([["▁the"] * 80], max_decoding_length=4)[0].hypotheses  # max_len 64
    one_line_error(*cli(capsys, "export-ct2", folder, out)[::2], "exists")
    code, _, err = cli(capsys, "export-ct2", folder, tmp_path / "other", "--quantization", "int3")
    assert code == 2 and "invalid choice: 'int3'" in err
    restricted = make_model(tmp_path / "restricted", neighborhood=4)
    one_line_error(*cli(capsys, "export-ct2", restricted, tmp_path / "r")[::2], "no restricted self-attention")
    heads = make_model(tmp_path / "heads", d_k=6, d_v=6)  # d_model 32, 4 heads: CTranslate2's heads are 8 wide
    one_line_error(*cli(capsys, "export-ct2", heads, tmp_path / "r")[::2],
                   "it needs d_k = d_v = d_model // h = 8; this model has d_k 6, d_v 6")
    assert not (tmp_path / "other").exists() and not (tmp_path / "r").exists()


def test_an_export_of_learned_positions_says_where_ctranslate2_fails_past_them(tmp_path):
    """aiayn cuts a source longer than a learned table and stops the output at its end;
    CTranslate2 fails on the whole batch there, and argostranslate decodes up to its default 256
    (found by an interop hunt: a 64-position model's export failed on a line aiayn translates, and
    neither export said a word)."""
    folder = make_model(tmp_path / "model", positional="learned", max_len=16)
    said = []
    export_ct2(folder, tmp_path / "ct2", echo=said.append)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    with pytest.raises(RuntimeError, match="No position encodings"):  # what the note is about
        translator.translate_batch([["▁the"] * 20], max_decoding_length=4)
    assert translator.translate_batch([["▁the"] * 15], max_decoding_length=16, min_decoding_length=16)[0].hypotheses
    assert said[1] == ("note: this model's learned positions end at 16: where aiayn cuts a source of more than 15 "
                       "pieces and stops an output there, CTranslate2 fails on the whole batch; give translate_batch "
                       "max_decoding_length=16 at most")
    said = []
    export_argos(folder, tmp_path / "en_es.argosmodel", source_lang="en", target_lang="es", echo=said.append)
    assert said[-1].startswith("note: this model's learned positions end at 16") and "argostranslate" in said[-1]
    said = []  # sinusoids are exported for every position aiayn decodes: nothing to say
    export_ct2(make_model(tmp_path / "sinusoids", max_len=16), tmp_path / "ct2-sinusoids", echo=said.append)
    assert len(said) == 1 and said[0].startswith("exported")


def test_an_argos_package_holds_the_ctranslate2_model_its_tokenizer_and_languages(tmp_path):
    """`aiayn export-argos`: the zip LibreTranslate installs. Its model, given the pieces of a
    sentence as argostranslate gives them (no EOS), gives aiayn's greedy tokens."""
    folder = make_model(tmp_path / "model")
    model, tokenizer = Transformer.load(folder).eval(), Tokenizer.load(folder)
    config = model.config
    # What an export killed mid-way (SIGKILL) leaves: its staging folder and the zip's temporary
    # file, which the next export removes (found in review: they stayed, 28 MB each for a toy model)
    (tmp_path / ".en_es.argosmodel.k1lled_0.tmp" / "en_es").mkdir(parents=True)
    (tmp_path / ".en_es.argosmodel.k1lled_1.tmp").write_bytes(b"PK")
    done = subprocess.run([sys.executable, "-m", "aiayn", "export-argos", str(folder),
                           str(tmp_path / "en_es.argosmodel"), "--source-lang", "en", "--target-lang", "es"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".en_es.argosmodel*"))
    wrote, note = done.stdout.strip().split("\n")
    install = shlex.split(wrote.split("install it with: ")[1])  # argospm takes only an index's names
    # argostranslate joins output pieces as text: a byte piece would come out as <0xNN> (found in review)
    assert note.startswith("note: Argos Translate writes the output's pieces out as they are named") and "<0xNN>" in note
    assert install[:2] == ["python", "-c"] and install[2].endswith(f"install_from_path({json.dumps(str(tmp_path / 'en_es.argosmodel'))})")
    with zipfile.ZipFile(tmp_path / "en_es.argosmodel") as archive:
        names = set(archive.namelist())
        assert {"en_es/metadata.json", "en_es/sentencepiece.model", "en_es/model/model.bin"} <= names
        metadata = json.loads(archive.read("en_es/metadata.json"))
        archive.extractall(tmp_path / "unzipped")
    assert (metadata["from_code"], metadata["to_code"], metadata["from_name"], metadata["to_name"]) == \
        ("en", "es", "English", "Spanish")
    package = tmp_path / "unzipped" / "en_es"
    assert (package / "sentencepiece.model").read_bytes() == (folder / "tokenizer.model").read_bytes()
    translator = ctranslate2.Translator(str(package / "model"), device="cpu")
    src = tokenizer.encode(SENTENCES[0])
    step = ModelStep(model, torch.tensor([src + [config.eos_id]]), LIMIT + 1)
    (ours,) = greedy(step.step, step.reorder, config.bos_id, config.eos_id, torch.full((1,), LIMIT))
    result = translator.translate_batch([[tokenizer.id_to_piece(i) for i in src]], beam_size=1,
                                        max_decoding_length=LIMIT, min_decoding_length=0)[0]
    assert [tokenizer.piece_to_id(p) for p in result.hypotheses[0]] == ours
    refused = subprocess.run([sys.executable, "-m", "aiayn", "export-argos", str(folder),
                              str(tmp_path / "other.argosmodel")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "give --source-lang and --target-lang" in refused.stderr
    # Argos names pt-BR and zh-Hant pb and zt, as LibreTranslate looks them up (found by an interop
    # hunt: the package said pt-BR, which no LibreTranslate client's pt-BR finds)
    export_argos(folder, tmp_path / "pb_zt.argosmodel", source_lang="pt-BR", target_lang="zh-Hant", echo=lambda _: None)
    with zipfile.ZipFile(tmp_path / "pb_zt.argosmodel") as archive:
        metadata = json.loads(archive.read("pb_zt/metadata.json"))
    assert (metadata["from_code"], metadata["to_code"], metadata["to_name"]) == ("pb", "zt", "Chinese (traditional)")


def test_what_ctranslate2_cannot_hold_is_refused_in_one_line():
    with pytest.raises(ValueError, match="d_k = d_v"):
        transformer_spec(Transformer(ModelConfig(vocab_size=20, d_model=16, n_heads=4, d_ff=32, n_layers=1, d_k=8)), [])
