"""Marian (OPUS-MT) models in and out: the HF `MarianMTModel` folder format.

Marian's model is the paper's Transformer (post-norm, sinusoidal positions, shared and tied
embeddings scaled by √d_model) with differences that are each a `ModelConfig` option here: the
sines and cosines of §3.5 laid out as [sin | cos] rather than interleaved (`positional=
"sinusoidal_concat"`), often a swish FFN (`activation`), an untrained bias on the logits
(`final_logits_bias`), decoding that starts from the pad token (`bos_id = pad_id`), LayerNorm
eps 1e-5 (`layer_norm_eps`), embeddings left unscaled where its config says `scale_embedding:
false` (`scale_embedding`); and a SentencePiece model per language (`MarianTokenizer`).

Both directions only read and write JSON, safetensors and SentencePiece files: `transformers` is
not needed here (the tests use it to check the results). A `pytorch_model.bin` is read with
`torch.load(weights_only=True)`, which refuses anything but tensors.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Callable, Iterator, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aiayn.checkpoint import build_model, check_path
from aiayn.files import atomic_dir, atomic_write, read_json, refuse_to_replace, write_json
from aiayn.config import DECODE_PRESETS, MAX_INPUT_TOKENS, MAX_OUTPUT_LEN, ModelConfig
from aiayn.model import Transformer, sinusoidal_positions
from aiayn.run import RunDir, check_vocabulary, model_inputs, run_files, said_model_dir, tokenizer_folder
from aiayn.tokenizer import MarianTokenizer, Tokenizer, load_tokenizer

HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
HF_LAYER_NORM_EPS = 1e-5  # torch's default, which Marian's nn.LayerNorm layers keep


def _pairs(config: ModelConfig) -> Iterator[tuple[str, str]]:
    """(aiayn name, HF name) of every per-layer tensor: the one mapping both directions use."""
    attention = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
    encoder = {"residual_attn.norm": "self_attn_layer_norm", "residual_ff.norm": "final_layer_norm"}
    decoder = {
        "residual_self.norm": "self_attn_layer_norm",
        "residual_cross.norm": "encoder_attn_layer_norm",
        "residual_ff.norm": "final_layer_norm",
    }
    common = {"feed_forward.w_1": "fc1", "feed_forward.w_2": "fc2"}
    for i in range(config.n_layers):
        for stack, norms, blocks in (
            ("encoder", encoder, {"self_attn": "self_attn"}),
            ("decoder", decoder, {"self_attn": "self_attn", "cross_attn": "encoder_attn"}),
        ):
            modules = {**norms, **common}
            for ours, theirs in blocks.items():
                modules.update({f"{ours}.{a}": f"{theirs}.{b}" for a, b in attention.items()})
            for ours, theirs in modules.items():
                for kind in ("weight", "bias"):
                    yield f"{stack}.layers.{i}.{ours}.{kind}", f"model.{stack}.layers.{i}.{theirs}.{kind}"


# --------------------------------------------------------------------------------------------
# import


def config_from_marian(hf: dict, unk_id: int) -> ModelConfig:
    """The aiayn config of an HF MarianConfig dict (whose unknown-token id is in the tokenizer's
    vocab.json), or a one-line error for what aiayn lacks."""

    def require(condition: bool, what: str) -> None:
        if not condition:
            raise ValueError(f"this Marian model is not supported: {what}")

    require(hf.get("model_type") == "marian", f"model_type is {hf.get('model_type')!r}, not 'marian'")
    needed = ("d_model", "vocab_size", "pad_token_id", "eos_token_id")
    needed += tuple(f"{side}_{key}" for side in ("encoder", "decoder") for key in ("layers", "ffn_dim", "attention_heads"))
    missing = [key for key in needed if key not in hf]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: not a complete Marian config")
    # (found in review: "32", a list or 0 heads were tracebacks below, not what ModelConfig says)
    wrong = [f"{key} {hf[key]!r}" for key in needed if isinstance(hf[key], bool) or not isinstance(hf[key], int)
             or hf[key] < (0 if key.endswith("token_id") else 1)]
    if wrong:
        raise ValueError(f"config.json: {', '.join(wrong)} must be whole numbers, sizes at least 1 and ids at least 0")
    require(hf["encoder_layers"] == hf["decoder_layers"], "encoder and decoder depths differ (aiayn has one N)")
    require(hf["encoder_ffn_dim"] == hf["decoder_ffn_dim"], "encoder and decoder d_ff differ")
    require(hf["encoder_attention_heads"] == hf["decoder_attention_heads"], "encoder and decoder head counts differ")
    require(not hf.get("normalize_before", False), "pre-norm Marian models are not handled")
    name = hf.get("activation_function", "gelu")
    activation = HF_ACTIVATIONS.get(name) if isinstance(name, str) else None
    require(activation is not None, f"activation {hf.get('activation_function')!r}")
    share = hf.get("share_encoder_decoder_embeddings", True)
    vocab = hf["vocab_size"]
    require(share or hf.get("decoder_vocab_size", vocab) == vocab, "source and target vocabularies differ in size")
    pad = hf["pad_token_id"]
    start = pad if hf.get("decoder_start_token_id") is None else hf["decoder_start_token_id"]  # null: Marian's pad
    require(start != hf["eos_token_id"], f"decoder_start_token_id {start} is its eos_token_id")  # (an interop hunt)
    require(hf["d_model"] % hf["encoder_attention_heads"] == 0, f"d_model {hf['d_model']} is not a multiple of "
            f"its {hf['encoder_attention_heads']} heads")  # (ModelConfig's message names options to set)
    return ModelConfig(
        vocab_size=vocab,
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        n_layers=hf["encoder_layers"],
        dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.0),
        activation=activation,
        layer_norm_eps=HF_LAYER_NORM_EPS,
        positional="sinusoidal_concat",
        max_len=hf.get("max_position_embeddings", 512),
        share_embeddings=share,
        scale_embedding=hf.get("scale_embedding", False),  # MarianConfig's default
        tie_output=hf.get("tie_word_embeddings", True),
        final_logits_bias=True,
        attention_bias=True,
        pad_id=pad,
        bos_id=start,
        eos_id=hf["eos_token_id"],
        unk_id=unk_id,
    )


# Tensors an HF Marian file may hold as copies of `model.shared.weight`.
COPIES_OF_SHARED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def exported_positions(config: ModelConfig) -> int:
    """The positions an exported sinusoidal model is given: every one aiayn decodes (its longest
    input and output), not only max_len's (found in review: a 261-token line aiayn translated
    failed in transformers and, before, in CTranslate2)."""
    return max(config.max_len, MAX_INPUT_TOKENS + MAX_OUTPUT_LEN)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The weights of an HF folder: model.safetensors, else pytorch_model.bin (tensors only), each
    whole or in the shards its `.index.json` maps (found by an interop hunt: a sharded folder was
    said to hold no weights)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return _read_weights_file(directory / name)
        if (directory / f"{name}.index.json").is_file():
            index = read_json(directory / f"{name}.index.json")
            shards = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(shards, dict) or not all(isinstance(shard, str) and "/" not in shard for shard in shards.values()):
                raise ValueError(f"{directory / f'{name}.index.json'} maps no weights to shard files of its folder")
            return {key: tensor for shard in sorted(set(shards.values()))
                    for key, tensor in _read_weights_file(directory / shard).items()}
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin (whole or in shards) in {directory}")


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except (SafetensorError, OSError) as error:
            raise ValueError(f"cannot read {path}: {error}") from None
    if path.is_file():
        try:
            weights = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(f"{path} holds more than tensors (a pickle that could run code), so it is not loaded; "
                             "ask for the model as model.safetensors") from None
        except (RuntimeError, EOFError, OSError) as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise ValueError(f"cannot read {path} (cut short or not a PyTorch weights file?): {reason[:200]}") from None
        if not isinstance(weights, dict) or not all(torch.is_tensor(v) for v in weights.values()):
            raise ValueError(f"{path} does not hold a dictionary of tensors")
        return weights
    raise FileNotFoundError(f"no such weights file: {path}")


def import_marian(
    hf_dir: Union[str, Path], out_dir: Union[str, Path], echo: Callable[[str], None] = print, force: bool = False
) -> Path:
    """Convert an HF Marian folder into an aiayn run folder `out_dir` whose `model/` holds the
    weights, config and Marian tokenizer, which `aiayn translate out_dir` runs. `out_dir` is
    written whole and atomically; an existing one only with `force`, and then replaced whole.
    Returns the model folder."""
    hf_dir, out_dir = check_path(hf_dir, "an HF Marian folder"), check_path(out_dir, "the output folder")
    refuse_to_replace(out_dir, force, inputs=[hf_dir], folder=True, kept=run_files(out_dir))
    try:
        hf = read_json(hf_dir / "config.json")
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in {hf_dir}: not an HF model folder" if hf_dir.is_dir() else f"{hf_dir} is a file, not a folder" if hf_dir.exists() else f"no such folder: {hf_dir}") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{hf_dir / 'config.json'} must hold a JSON object")
    if hf.get("activation_dropout", 0.0):
        echo(f"note: activation_dropout={hf['activation_dropout']} has no aiayn counterpart and is dropped")
    if not MarianTokenizer.is_in(hf_dir):
        raise FileNotFoundError(f"{hf_dir} lacks the Marian tokenizer files (source.spm, target.spm, vocab.json)")
    try:  # a tokenizer setting, saved in tokenizer_config.json
        separate = read_json(hf_dir / "tokenizer_config.json").get("separate_vocabs") is True
    except (OSError, ValueError, AttributeError):
        separate = False
    if separate or (hf_dir / "target_vocab.json").exists():
        raise ValueError(f"{hf_dir} has a target vocabulary of its own (target_vocab.json); aiayn imports Marian "
                         "models of one shared vocabulary")
    tokenizer = MarianTokenizer.load(hf_dir)
    config = config_from_marian(hf, tokenizer.unk_id)
    try:  # found in review: a size, or special ids, other than vocab.json's imported, then failed to translate
        check_vocabulary(tokenizer, config)
    except ValueError as error:
        raise ValueError(f"{hf_dir}: vocab.json and config.json disagree: {error}") from None

    state, config = _state_of(hf_dir, config)
    model = build_model(Transformer, config, hf_dir / "config.json")
    try:
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    except RuntimeError as error:  # torch lists every mismatch on lines of their own: the first says which
        mismatch = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), str(error))
        raise ValueError(f"the weights in {hf_dir} do not fit its config.json: {mismatch}") from None
    tied = {"decoder.embed.lookup.weight"} if config.share_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")

    def build(folder: Path) -> None:
        RunDir(folder).save_final(model, tokenizer)

    atomic_dir(out_dir, build, force)
    model_dir = RunDir(out_dir).final
    echo(f"imported {hf_dir} -> {model_dir}: {config.n_layers}+{config.n_layers} layers, d_model {config.d_model}, "
         f"{config.activation}, vocabulary {config.vocab_size}, {model.num_parameters():,} parameters")
    return model_dir


def _state_of(hf_dir: Path, config: ModelConfig) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """aiayn's state dict from the weights of the HF Marian folder `hf_dir`, described by `config`,
    and the config, unshared where the weights' own tables are (below)."""
    weights = _read_weights(hf_dir)
    if "model.shared.weight" not in weights and "shared.weight" in weights:
        # A MarianModel's folder (no LM head): its keys lack MarianMTModel's "model." prefix, which
        # transformers adds when loading it (found in review: refused).
        weights = {f"model.{key}": tensor for key, tensor in weights.items()}
    read: set[str] = set()

    def get(name: str, *fallbacks: str) -> torch.Tensor:
        for key in (name, *fallbacks):
            if key in weights:
                read.add(key)
                return weights[key]
        raise ValueError(f"the weights lack {name}")

    state = {ours: get(theirs) for ours, theirs in _pairs(config)}
    shared = get("model.shared.weight", "model.encoder.embed_tokens.weight")
    own = [weights.get(f"model.{side}.embed_tokens.weight") for side in ("encoder", "decoder")]
    if config.share_embeddings and all(table is not None and table.shape == shared.shape for table in own) and \
            not all(torch.equal(table, shared) for table in own):
        # transformers 5 ties the encoder's and decoder's tables to the shared one only with
        # tie_word_embeddings, and computes with their own where it is false (found in review: refused)
        config = dataclasses.replace(config, share_embeddings=False)
    state["encoder.embed.lookup.weight"] = shared if config.share_embeddings else get("model.encoder.embed_tokens.weight")
    state["decoder.embed.lookup.weight"] = shared if config.share_embeddings else get("model.decoder.embed_tokens.weight")
    if not config.tie_output:
        state["output_proj.weight"] = get("lm_head.weight")
    state["logits_bias"] = get("final_logits_bias").reshape(-1) if "final_logits_bias" in weights else torch.zeros(config.vocab_size)
    _check_positions(hf_dir, weights, config)
    # Weights its config does not describe (found in review: a config of 1 layer dropped layer 2 unsaid);
    # not the positions HF computes, nor copies of the table each stands for: the shared one, or
    # the decoder's for a tied output of unshared tables (found by an interop hunt: refused).
    copies = {key: shared for key in COPIES_OF_SHARED}
    if config.tie_output:
        copies["lm_head.weight"] = state["decoder.embed.lookup.weight"]
    unread = sorted(key for key, tensor in weights.items() if key not in read and "embed_positions" not in key
                    and not (key in copies and tensor.shape == copies[key].shape and torch.equal(tensor, copies[key])))
    if unread:
        raise ValueError(f"{hf_dir} holds {len(unread)} weights its config.json does not describe ({', '.join(unread[:3])}"
                         f"{', ...' if len(unread) > 3 else ''}): they are of another model")
    return state, config


def _check_positions(hf_dir: Path, weights: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """Position tables in the weights, which transformers loads over the sinusoids it computes,
    must be those sinusoids: aiayn computes them (found by an interop hunt: a learned table was
    dropped without a word, and every translation differed from transformers'). The tolerance
    is a bf16 table's rounding, 2⁻⁸, far below what a learned table differs by."""
    for key in sorted(key for key in weights if "embed_positions" in key):
        table = weights[key].float()
        if table.dim() != 2 or table.size(1) != config.d_model or not torch.allclose(
                table, sinusoidal_positions(table.size(0), config.d_model, concat=True), rtol=0, atol=2 ** -8):
            raise ValueError(f"{hf_dir} holds {key}, which is not the sinusoids Marian computes (learned "
                             "positions?): aiayn imports Marian models of sinusoidal positions only")


# --------------------------------------------------------------------------------------------
# export


def marian_config(config: ModelConfig) -> dict:
    """The HF MarianConfig dict of an aiayn config, or a one-line error for what Marian lacks."""

    def require(condition: bool, what: str) -> None:
        if not condition:
            raise ValueError(f"cannot export as Marian: {what}")

    require(config.positional in ("sinusoidal", "sinusoidal_concat"), "Marian has no learned positions")
    require(not config.norm_first, "Marian is post-norm (§3.1) and this model is pre-norm (norm_first, as --recipe "
                                   "fast trains); a model trained with --norm-first false is one Marian can hold "
                                   "(export-ct2 writes either kind for CTranslate2)")
    # h · d_k = d_model exactly: d_model 30 with 4 heads of d_k 7 was written, which transformers
    # refuses to load ("embed_dim must be divisible by num_heads") and import-hf too (an interop hunt)
    require(config.head_dims == (config.d_model // config.n_heads,) * 2 and config.d_model % config.n_heads == 0,
            "Marian needs d_k = d_v = d_model / h")
    require(config.neighborhood is None, "Marian has no restricted self-attention")
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.n_layers,
        "decoder_layers": config.n_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": config.activation,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": exported_positions(config),
        "scale_embedding": config.scale_embedding,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": config.tie_output,
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "forced_eos_token_id": config.eos_id,
        "decoder_start_token_id": config.bos_id,
        "is_encoder_decoder": True,
    }


def _concat_order(d_model: int) -> torch.Tensor:
    """Interleaved sinusoid dimensions in [sin | cos] order: [0, 2, 4, ..., 1, 3, 5, ...]."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _permute_residual_stream(state: dict[str, torch.Tensor], order: torch.Tensor) -> dict[str, torch.Tensor]:
    """Re-index the d_model axis of every tensor that reads or writes the residual stream.

    Reordering the basis of the residual stream changes no output when every such tensor is
    reordered alike: LayerNorm treats the d_model features as a set, and the attention and FFN
    internals never see the order. So a model with interleaved sinusoids (§3.5) becomes exactly a
    model with Marian's [sin | cos] sinusoids."""
    writes_stream = ("w_o.", "w_2.", ".norm.")
    out = {}
    for name, tensor in state.items():
        if name.endswith("lookup.weight") or name == "output_proj.weight":
            out[name] = tensor[:, order]  # (vocab, d_model)
        elif any(key in name for key in writes_stream):
            out[name] = tensor[order]  # rows (or a vector) on the stream
        elif name.endswith(".weight") and tensor.dim() == 2:
            out[name] = tensor[:, order]  # w_q, w_k, w_v, w_1 read the stream
        else:
            out[name] = tensor  # their biases, the logits bias
    return out


# OPUS-MT models keep <pad> as the last row of their vocabulary, and CTranslate2's converter
# drops that row from every Marian model (its decoder starts from a zero vector instead). A model
# trained by aiayn has <pad> first, so its export adds a last row for the converter to drop: a
# zero embedding named <pad>, the config's pad token; aiayn's own pad piece keeps its row under
# PAD_PIECE (no text encodes to either, and generation is barred from both).
MARIAN_PAD, PAD_PIECE = "<pad>", "<aiayn-pad>"
# CTranslate2 keeps aiayn's pad row as an ordinary token, its logit the bias alone (the row is
# zero): this bias at that id bars it there as aiayn's search bars it (finite, so fp16 keeps it).
BARRED_LOGIT = -1e4


def _marian_vocab(tokenizer: Tokenizer, pad_id: int) -> dict[str, int]:
    """vocab.json of an aiayn tokenizer: its pieces by id, then Marian's <pad> as one more row."""
    vocab = {(PAD_PIECE if i == pad_id else tokenizer.id_to_piece(i)): i for i in range(tokenizer.vocab_size)}
    vocab[MARIAN_PAD] = tokenizer.vocab_size
    return vocab


def _with_pad_row(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every (vocabulary, ...) tensor with one zero row more at the end: Marian's <pad>."""
    rows = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
            "lm_head.weight", "final_logits_bias")
    out = dict(weights)
    for name in (name for name in rows if name in weights):
        tensor = weights[name]
        if name == "final_logits_bias":  # (1, V)
            out[name] = torch.cat([tensor, tensor.new_zeros(1, 1)], dim=1)
        else:  # (V, d_model)
            out[name] = torch.cat([tensor, tensor.new_zeros(1, tensor.size(1))])
    return out


def export_marian(
    model_path: Union[str, Path], out_dir: Union[str, Path], echo: Callable[[str], None] = print, force: bool = False
) -> Path:
    """Write an HF Marian folder (config, safetensors weights, SentencePiece models, vocab.json)
    from an aiayn model or run folder, atomically; an existing `out_dir` only with `force`.
    Returns `out_dir`."""
    model_dir, out_dir = said_model_dir(model_path), check_path(out_dir, "the output folder")
    tokenizer_dir = tokenizer_folder(model_dir, model_path)
    refuse_to_replace(out_dir, force, inputs=model_inputs(model_path), folder=True, kept=run_files(out_dir))
    model = Transformer.load(model_dir)
    config = model.config
    hf = marian_config(config)
    tokenizer = load_tokenizer(tokenizer_dir)
    check_vocabulary(tokenizer, config)  # found in review: <pad> went to a real row of a larger model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.positional == "sinusoidal":
        state = _permute_residual_stream(state, _concat_order(config.d_model))
    embed = state["encoder.embed.lookup.weight"]
    # Marian's projections always have biases: zeros where the paper's have none (attention_bias)
    weights = {theirs: state[ours].contiguous() if ours in state else torch.zeros(len(state[ours[:-4] + "weight"]))
               for ours, theirs in _pairs(config)}
    if config.share_embeddings:  # an unshared Marian has no shared table (found in review: transformers' UNEXPECTED)
        weights["model.shared.weight"] = embed.clone()
    weights["model.encoder.embed_tokens.weight"] = embed.clone()
    weights["model.decoder.embed_tokens.weight"] = state["decoder.embed.lookup.weight"].clone()
    weights["lm_head.weight"] = (
        state["decoder.embed.lookup.weight"] if config.tie_output else state["output_proj.weight"]
    ).clone()
    bias = state.get("logits_bias", torch.zeros(config.vocab_size))
    weights["final_logits_bias"] = bias.reshape(1, -1).contiguous()
    native = not isinstance(tokenizer, MarianTokenizer)  # an imported model keeps its Marian vocabulary
    pad, start = config.pad_id, config.bos_id
    zero_start = state["decoder.embed.lookup.weight"][config.bos_id].abs().max() == 0
    if native:
        weights["final_logits_bias"][0, config.pad_id] = BARRED_LOGIT
        weights, pad = _with_pad_row(weights), config.vocab_size
        start = pad if zero_start else start  # Marian's own start, the same zero vector: its output skips it as text
        hf = {**hf, "vocab_size": config.vocab_size + 1, "decoder_vocab_size": config.vocab_size + 1, "pad_token_id": pad,
              "decoder_start_token_id": start}

    def build(folder: Path) -> None:
        atomic_write(folder / "model.safetensors", lambda tmp: save_file(weights, tmp, metadata={"format": "pt"}))
        write_json(folder / "config.json", hf)
        write_json(folder / "generation_config.json", {
            "decoder_start_token_id": start,
            "eos_token_id": config.eos_id,
            "forced_eos_token_id": config.eos_id,
            "pad_token_id": pad,
            "bad_words_ids": sorted({(config.pad_id,), (pad,)}),
            "num_beams": DECODE_PRESETS["translate"].beam,  # §6.1
            "min_new_tokens": DECODE_PRESETS["translate"].min_len,  # aiayn's: no EOS at the first step
            "max_length": config.max_len,
        })
        if isinstance(tokenizer, MarianTokenizer):
            tokenizer.save(folder)
        else:
            MarianTokenizer(tokenizer.model_proto, tokenizer.model_proto, _marian_vocab(tokenizer, config.pad_id)).save(folder)
        write_json(folder / "tokenizer_config.json", {"tokenizer_class": "MarianTokenizer",
                                                     "model_max_length": exported_positions(config)})

    atomic_dir(out_dir, build, force)
    for note in _export_notes(config, zero_start, imported=isinstance(tokenizer, MarianTokenizer)):
        echo(note)
    echo(f"exported {model_dir} -> {out_dir} (HF MarianMTModel folder)")
    return out_dir


def _export_notes(config: ModelConfig, zero_start: bool, imported: bool) -> list[str]:
    """What an exported model computes otherwise in Marian's runtimes than in aiayn; the advice
    only for a model aiayn trained (found by an interop hunt: an imported one was told to retrain)."""
    notes = []
    if config.layer_norm_eps != HF_LAYER_NORM_EPS:
        notes.append(f"note: Marian's LayerNorm eps is {HF_LAYER_NORM_EPS:g}, this model's {config.layer_norm_eps:g}: "
                     "outputs differ in the last digits")
    if not zero_start:  # with BOS = pad, a pad row that training moved (found in review: the advice was to do so)
        notes.append("note: CTranslate2 starts a Marian decoder from a zero vector; this model starts from BOS's "
                     "learned embedding, so CTranslate2's output will differ from aiayn's and HF's" +
                     ("" if imported else " (its BOS is the pad token, but that row is not zero: retrain with today's "
                      "aiayn, which keeps it zero)" if config.bos_id == config.pad_id else
                      " (train with --bos-id equal to --pad-id, as Marian does, to deploy there)"))
    return notes
