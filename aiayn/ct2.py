"""CTranslate2 models and Argos Translate packages, written straight from an aiayn model.

CTranslate2 describes an encoder-decoder Transformer by a specification of its layers
(`ctranslate2.specs.TransformerSpec`), which its own converters fill from fairseq, OpenNMT or
Marian weights. This module fills it from an aiayn model, so that whatever CTranslate2 can
compute exports as it is, where the Marian route (aiayn.marian) cannot go:

- pre-norm models (`norm_first`, the `fast` recipe and the demo's) as well as the paper's
  post-norm (§3.1); Marian is post-norm only;
- decoding starts from BOS's own learned embedding, as aiayn's does (CTranslate2 starts a Marian
  decoder from a zero vector);
- the source gets EOS appended by CTranslate2 itself (`add_source_eos`), as aiayn's batches end
  every source with it, so that a caller passing plain SentencePiece pieces (argostranslate,
  LibreTranslate) gives the model the input it was trained on;
- the positions are aiayn's own table (§3.5 sinusoids, interleaved or [sin | cos], or Table 3
  row E's learned ones), LayerNorm keeps the model's eps, and the pre-softmax projection bars
  the pad token with a logits bias, as aiayn's search bars it.

`tests/test_ct2.py` holds CTranslate2's log-probabilities of a target within 1e-4 of aiayn's and
its greedy tokens equal.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from aiayn.checkpoint import check_path, read_config
from aiayn.config import CT2_QUANTIZATIONS, ModelConfig, argos_code, is_language_code
from aiayn.corpora import language_name
from aiayn.files import (atomic_dir, atomic_write, naming, output_lock, refuse_to_replace, remove_unfinished, undo_new_parents,
                         write_json)
from aiayn.marian import BARRED_LOGIT, exported_positions
from aiayn.model import Transformer, sinusoidal_positions
from aiayn.run import check_vocabulary, languages_of, model_inputs, run_files, said_model_dir, tokenizer_folder
from aiayn.tokenizer import MODEL_FILE, Tokenizer, load_tokenizer

ARGOS_VERSION = "1.9"  # the package format of argostranslate 1.9 and later


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(f"this needs CTranslate2 ({error}): pip install 'aiayn[marian]'") from None
    return ctranslate2


def check_exportable(config: ModelConfig) -> None:
    """A one-line error for what CTranslate2's Transformer cannot hold."""
    if config.neighborhood is not None:
        raise ValueError("cannot export to CTranslate2: it has no restricted self-attention (neighborhood)")
    if config.head_dims != (width := config.d_model // config.n_heads,) * 2:  # its heads split d_model (rounded down)
        raise ValueError(f"cannot export to CTranslate2: it needs d_k = d_v = d_model // h = {width}; this model has "
                         f"d_k {config.head_dims[0]}, d_v {config.head_dims[1]}")
    if config.activation not in ("relu", "gelu", "swish", "silu"):
        raise ValueError(f"cannot export to CTranslate2: no activation {config.activation!r}")


def transformer_spec(model: Transformer, pieces: list[str]):
    """The `ctranslate2.specs.TransformerSpec` of `model`, its vocabulary `pieces` (by id).
    Length: one assignment per tensor of the model, in the order of its modules."""
    specs = _ctranslate2().specs
    config = model.config
    check_exportable(config)
    activations = {"relu": specs.Activation.RELU, "gelu": specs.Activation.GELU,
                   "swish": specs.Activation.SWISH, "silu": specs.Activation.SWISH}
    spec = specs.TransformerSpec.from_config(config.n_layers, config.n_heads, pre_norm=config.norm_first,
                                             activation=activations[config.activation])
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.config.unk_token, spec.config.eos_token = pieces[config.unk_id], pieces[config.eos_id]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[config.bos_id]
    spec.config.add_source_eos = True
    state = {name: tensor.detach().float() for name, tensor in model.state_dict().items()}
    array = lambda name: state[name].numpy()  # noqa: E731
    if config.positional == "learned":
        positions = state["encoder.positions.table.weight"], state["decoder.positions.table.weight"]
    else:
        # (found in review: a 750-token line translated in aiayn but failed in CTranslate2)
        table = sinusoidal_positions(exported_positions(config), config.d_model, config.positional == "sinusoidal_concat")
        positions = table.float(), table.float()

    def linear(target, name: str, *fused: str) -> None:  # W (out, in) and b, several fused along out
        names = (name, *fused)
        target.weight = torch.cat([state[f"{n}.weight"] for n in names]).numpy()
        if f"{name}.bias" in state:  # the paper's attention projections have none (ModelConfig.attention_bias)
            target.bias = torch.cat([state[f"{n}.bias"] for n in names]).numpy()

    def norm(target, name: str) -> None:
        target.gamma, target.beta = array(f"{name}.weight"), array(f"{name}.bias")

    def ffn(target, prefix: str) -> None:
        norm(target.layer_norm, f"{prefix}.residual_ff.norm")
        linear(target.linear_0, f"{prefix}.feed_forward.w_1")
        linear(target.linear_1, f"{prefix}.feed_forward.w_2")

    for name, stack, table in zip(("encoder", "decoder"), (spec.encoder, spec.decoder), positions):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = array(f"{name}.embed.lookup.weight")
        stack.scale_embeddings = config.scale_embedding  # True: × √d_model (§3.4)
        stack.position_encodings.encodings = table.numpy()
        if config.norm_first:
            norm(stack.layer_norm, f"{name}.final_norm")
    for i, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder.layers.{i}"
        attention = layer.self_attention
        linear(attention.linear[0], f"{prefix}.self_attn.w_q", f"{prefix}.self_attn.w_k", f"{prefix}.self_attn.w_v")
        linear(attention.linear[1], f"{prefix}.self_attn.w_o")
        norm(attention.layer_norm, f"{prefix}.residual_attn.norm")
        ffn(layer.ffn, prefix)
    for i, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder.layers.{i}"
        attention, cross = layer.self_attention, layer.attention
        linear(attention.linear[0], f"{prefix}.self_attn.w_q", f"{prefix}.self_attn.w_k", f"{prefix}.self_attn.w_v")
        linear(attention.linear[1], f"{prefix}.self_attn.w_o")
        norm(attention.layer_norm, f"{prefix}.residual_self.norm")
        linear(cross.linear[0], f"{prefix}.cross_attn.w_q")
        linear(cross.linear[1], f"{prefix}.cross_attn.w_k", f"{prefix}.cross_attn.w_v")
        linear(cross.linear[2], f"{prefix}.cross_attn.w_o")
        norm(cross.layer_norm, f"{prefix}.residual_cross.norm")
        ffn(layer.ffn, prefix)
    projection = state["decoder.embed.lookup.weight"] if config.tie_output else state["output_proj.weight"]
    bias = state.get("logits_bias", torch.zeros(config.vocab_size)).clone()
    bias[config.pad_id] = BARRED_LOGIT  # padding is no word: aiayn's search never predicts it
    spec.decoder.projection.weight, spec.decoder.projection.bias = projection.numpy(), bias.numpy()
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def _write_ct2(model_dir: Path, tokenizer: Tokenizer, out_dir: Path, quantization: Optional[str]) -> None:
    """The CTranslate2 model of the model in `model_dir` into the new folder `out_dir`."""
    ctranslate2 = _ctranslate2()
    model = Transformer.load(model_dir).eval()
    check_vocabulary(tokenizer, model.config)  # found in review: an IndexError, or a model the tokenizer outruns
    spec = transformer_spec(model, [tokenizer.id_to_piece(i) for i in range(model.config.vocab_size)])

    class AiaynConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    AiaynConverter().convert(str(out_dir), quantization=quantization, force=True)


def native_tokenizer(model_dir: Path, model_path: Union[str, Path]) -> tuple[Path, Tokenizer]:
    """The run's SentencePiece model, one for both sides (what CTranslate2's vocabulary and an
    Argos package hold), or a one-line error for Marian's two."""
    folder = tokenizer_folder(model_dir, model_path)
    tokenizer = load_tokenizer(folder)
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError("this model has Marian's two SentencePiece models: export it with export-hf and "
                         "ct2-transformers-converter")
    return folder, tokenizer


def export_ct2(model_path: Union[str, Path], out_dir: Union[str, Path], quantization: Optional[str] = None,
               force: bool = False, echo: Callable[[str], None] = print) -> Path:
    """Write the CTranslate2 model folder of an aiayn run or model folder (weights in
    `quantization`, one of CT2_QUANTIZATIONS, else as they are), with the run's tokenizer beside it
    as `tokenizer.model`, atomically; an existing `out_dir` only with `force`."""
    if quantization is not None and quantization not in CT2_QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}: one of {', '.join(CT2_QUANTIZATIONS)}")
    model_dir, out_dir = said_model_dir(model_path), check_path(out_dir, "the output folder")
    refuse_to_replace(out_dir, force, inputs=model_inputs(model_path), folder=True, kept=run_files(out_dir))
    folder, tokenizer = native_tokenizer(model_dir, model_path)

    def build(tmp: Path) -> None:
        _write_ct2(model_dir, tokenizer, tmp, quantization)
        (tmp / "tokenizer.model").write_bytes((folder / MODEL_FILE).read_bytes())

    atomic_dir(out_dir, build, force)
    echo(f"exported {model_dir} -> {out_dir} (CTranslate2 model{f', {quantization}' if quantization else ''}; "
         "its tokenizer.model is the run's SentencePiece model)")
    if note := learned_positions_note(model_dir, argos=False):
        echo(note)
    return out_dir


def learned_positions_note(model_dir: Path, argos: bool) -> Optional[str]:
    """What a model of learned positions does past its table in CTranslate2, which aiayn never
    meets: aiayn cuts a longer source and stops the output there, where CTranslate2 fails on the
    whole batch ("No position encodings are defined for positions >= 64"; found by an interop
    hunt: a 64-position model's export failed on a 35-piece line, whose translation ran past
    position 63, in CTranslate2's default max_decoding_length of 256). None for sinusoids, which
    are exported for every position aiayn decodes. `argos`: of a package, which argostranslate
    decodes without a max_decoding_length, so up to CTranslate2's default."""
    config = read_config(model_dir)[1]
    if config.positional != "learned":
        return None
    return (f"note: this model's learned positions end at {config.max_len}: where aiayn cuts a source of more than "
            f"{config.max_len - 1} pieces and stops an output there, CTranslate2 fails on the whole batch" +
            (" (in LibreTranslate too: argostranslate gives CTranslate2 no max_decoding_length)" if argos else
             f"; give translate_batch max_decoding_length={config.max_len} at most"))


def export_argos(model_path: Union[str, Path], out_file: Union[str, Path], source_lang: Optional[str] = None,
                 target_lang: Optional[str] = None, force: bool = False, echo: Callable[[str], None] = print) -> Path:
    """Write an Argos Translate package (`.argosmodel`, what LibreTranslate and argostranslate
    install): a zip of one folder holding metadata.json, model/ (the CTranslate2 model of
    `export_ct2`) and sentencepiece.model (the run's tokenizer, which Argos uses for both sides).
    The languages are the run's, unless given. Argos splits sentences itself, with a model it
    downloads on first use (MiniSBD), or with spaCy (ARGOS_CHUNK_TYPE=SPACY) from a pipeline in
    the package's spacy/ folder (benchmarks/libretranslate_load.py adds one)."""
    check_path(out_file, "the package file")
    if str(out_file).endswith(("/", os.sep)):  # Path drops the slash: a file of that name was written (found in review)
        raise ValueError(f"{out_file} ends in /, a folder's name; the package is one file, such as en_de.argosmodel")
    model_dir, out_file = said_model_dir(model_path), Path(out_file)
    refuse_to_replace(out_file, force, inputs=model_inputs(model_path), folder=False, kept=run_files(out_file))
    # The tokenizer before the languages: an imported Marian model was asked for its languages,
    # then refused for its tokenizer (found by an interop hunt).
    folder, tokenizer = native_tokenizer(model_dir, model_path)  # refused before the lock makes any folder
    source, target = _package_languages(model_path, source_lang, target_lang)
    # One writer: two packages into one file both said "wrote" (found in review).
    with undo_new_parents(out_file), output_lock(out_file):
        _write_argos(model_dir, folder, tokenizer, out_file, source, target, force)
    byte_pieces = tokenizer.piece_to_id("<0xFF>") != tokenizer.unk_id
    # argospm installs only by name from the online index; a file goes through the package API.
    path = json.dumps(str(out_file), ensure_ascii=False)  # a Python string, inside the shell's quotes
    install = f"import argostranslate.package; argostranslate.package.install_from_path({path})"
    echo(f"wrote {out_file} (Argos Translate package {source} → {target}); install it with: python -c {shlex.quote(install)}")
    if byte_pieces:  # argostranslate joins the output pieces as text (found in review)
        echo("note: Argos Translate writes the output's pieces out as they are named, so a character this "
             "vocabulary spells in bytes (SentencePiece's byte fallback, for characters its training text "
             "lacked) comes out of LibreTranslate as <0xNN>; aiayn serve decodes them")
    if note := learned_positions_note(model_dir, argos=True):
        echo(note)
    return out_file


def _package_languages(model_path: Union[str, Path], source_lang: Optional[str],
                       target_lang: Optional[str]) -> tuple[str, str]:
    """The package's two language codes: those given, else the run's."""
    recorded = languages_of(model_path)
    source, target = source_lang or recorded[0], target_lang or recorded[1]
    if not source or not target:
        raise ValueError(f"{model_path} does not record its languages; give --source-lang and --target-lang")
    for code, flag in ((source, "--source-lang"), (target, "--target-lang")):
        if not is_language_code(code):  # (found in review: a run's "english", or "../x" from Python, was written)
            raise ValueError(f"the package's language {code!r} is no language code (en, de, pt-BR); give one with {flag}")
    source, target = argos_code(source), argos_code(target)  # (found by an interop hunt: pt-BR written, not pb)
    if source == target:  # LibreTranslate lists a pair by its two codes: one code is no pair
        raise ValueError(f"the package's source and target language are both {source!r}; give the model's two "
                         "languages with --source-lang and --target-lang")
    return source, target


def _write_argos(model_dir: Path, folder: Path, tokenizer, out_file: Path, source: str, target: str,
                 force: bool) -> None:
    """`export_argos`'s work, under the output's lock: the package of the model in `model_dir` and
    the tokenizer in `folder`."""
    name = f"{source}_{target}"
    # Staged under a name the next writer's remove_unfinished knows, as the zip's own temporary
    # file is: a writer killed mid-way left both for good (found in review: 28 MB each, a toy model).
    remove_unfinished(out_file)
    with tempfile.TemporaryDirectory(prefix=f".{out_file.name}.", suffix=".tmp", dir=out_file.parent) as tmp:
        package = Path(tmp) / name
        with naming(out_file):
            _write_ct2(model_dir, tokenizer, package / "model", None)
            (package / "sentencepiece.model").write_bytes((folder / MODEL_FILE).read_bytes())
        write_json(package / "metadata.json", {
            "package_version": "1.0", "argos_version": ARGOS_VERSION, "type": "translate",
            "from_code": source, "from_name": language_name(source), "to_code": target, "to_name": language_name(target),
        })

        def write(tmp_zip: str) -> None:
            with zipfile.ZipFile(tmp_zip, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(package.rglob("*")):
                    archive.write(path, path.relative_to(package.parent))

        refuse_to_replace(out_file, force, folder=False)  # made meanwhile by a writer that takes no lock
        atomic_write(out_file, write)
