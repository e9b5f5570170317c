"""The Transformer (§3 of Vaswani et al., 2017), read top to bottom in the paper's order.

Tensors are batch first: tokens are LongTensors (B, L); hidden states are (B, L, d_model).
Masks are boolean with True = may attend (see aiayn.attention) and are built here from the
padding index of the config, so callers pass token ids only.

The three families of the lecture are built from the same layers: `Transformer`
(encoder-decoder, the paper's model), `EncoderModel` (encoder only) and `DecoderModel` (decoder
only, without the encoder-decoder attention sub-layer)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import MultiHeadAttention
from aiayn.batching import check_positions, check_tokens
from aiayn.cache import KVCache
from aiayn.checkpoint import load_model, save_model
from aiayn.config import ModelConfig, check_model_config
from aiayn.kernels import Dropout, cache_dtype, relu

# --------------------------------------------------------------------------------------------
# §3.5 Positional encoding


def sinusoidal_positions(length: int, d_model: int, concat: bool = False) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Sine and cosine interleaved on even and odd dimensions, exactly as §3.5. With `concat` the same
    values are laid out as all sines, then all cosines, as Marian (OPUS-MT) models have them.
    Returns (length, d_model).
    """
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model / 2,)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (L, d_model / 2)
    if concat:
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()
    pe = torch.empty(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()


class PositionalEncoding(nn.Module):
    """Adds position information to the embeddings: fixed sinusoids (§3.5) or, as Table 3 row E,
    a learned embedding per position."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.positional
        self.max_len = config.max_len
        if self.kind == "learned":
            self.table = nn.Embedding(config.max_len, config.d_model)
        else:
            # Not a parameter and not saved: it is a function of the shape alone. A model being sized
            # (aiayn.checkpoint.meta_model) gets its shape only: computing it there imports Dynamo.
            self.concat = self.kind == "sinusoidal_concat"
            table = torch.empty(config.max_len, config.d_model, dtype=torch.float32)  # where the model is built
            if not table.is_meta:
                table = sinusoidal_positions(config.max_len, config.d_model, self.concat)  # (max_len, d_model)
            self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor, start: Union[int, Tensor] = 0, end: Optional[int] = None) -> Tensor:
        """x: (B, L, d_model), the embeddings of positions start .. start + L - 1; `start` is an
        int, or a LongTensor (B,) with each row's own (rows that joined a decoding later), and
        then `end`, one past the largest position, if the caller knows it without reading the
        device."""
        if isinstance(start, Tensor):
            end = end if end is not None else int(start.max()) + x.size(1)
            rows = start[:, None] + torch.arange(x.size(1), device=x.device)  # (B, L) positions
        else:
            end = start + x.size(1)
            rows = slice(start, end)
        if self.kind == "learned":
            if end > self.max_len:
                raise ValueError(f"position {end - 1} is beyond the {self.max_len} learned positions (max_len)")
            return x + self.table.weight[rows]
        if end > self.table.size(0):
            # Sinusoids extend to any length (§3.5: "extrapolate to sequence lengths longer").
            self.table = sinusoidal_positions(end, x.size(-1), self.concat).to(self.table.device)
        return x + self.table[rows].to(x.dtype)


# --------------------------------------------------------------------------------------------
# §3.4 Embeddings and softmax


class Embeddings(nn.Module):
    """Learned token embeddings multiplied by √d_model (§3.4; by 1 where `scale_embedding` is off,
    as some Marian models have it). The same matrix can serve as the source embedding, the target
    embedding and the pre-softmax projection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        check_model_config(config)  # every model builds its embeddings first
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.lookup = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)

    @property
    def weight(self) -> Tensor:
        return self.lookup.weight  # (vocab_size, d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.lookup(tokens) * self.scale  # (B, L, d_model)


class _PaddingRowKept(torch.autograd.Function):
    """The table as it is, whose gradient leaves padding's row out, as the lookup's does: tied to
    the pre-softmax projection, that row stays zero, so a decoder that starts from the padding
    token (`--bos-id` = pad) starts from a zero vector, as Marian's and CTranslate2's do."""

    @staticmethod
    def forward(ctx, table: Tensor, pad_id: int) -> Tensor:  # (V, d_model)
        ctx.pad_id = pad_id
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone()  # (V, d_model): autograd may hold the incoming one elsewhere
        grad[ctx.pad_id] = 0.0  # a view's fill: an index tensor would be a host copy, a GPU wait
        return grad, None


# --------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network

_ACTIVATIONS = {"relu": relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """FFN(x) = max(0, xW_1 + b_1) W_2 + b_2, applied to each position separately (§3.3).
    The non-linearity is ReLU by default; GELU and swish are options (for imported models)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.activation = _ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))  # (B, L, d_ff) -> (B, L, d_model)


# --------------------------------------------------------------------------------------------
# §3.1 Residual connection and layer normalisation around each sub-layer


class Residual(nn.Module):
    """Post-norm LayerNorm(x + Dropout(Sublayer(x))) as §3.1 and §5.4 (the default), or pre-norm
    x + Dropout(Sublayer(LayerNorm(x))) when `norm_first`. Dropout is `nn.Dropout` with
    P_drop = 0.1 in the paper (drawn faster on a CPU by aiayn.kernels)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor, sublayer) -> tuple[Tensor, Optional[Tensor]]:
        """`sublayer` maps (B, L, d_model) to (output, attention weights or None)."""
        if self.norm_first:
            out, weights = sublayer(self.norm(x))
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return self.norm(x + self.dropout(out)), weights


def _attention(config: ModelConfig, self_attention: bool) -> MultiHeadAttention:
    """Restricted attention (`config.neighborhood`, Table 1) applies to self-attention only."""
    d_k, d_v = config.head_dims
    return MultiHeadAttention(config.d_model, config.n_heads, d_k, d_v, dropout=config.attention_dropout, bias=config.attention_bias,
                              neighborhood=config.neighborhood if self_attention else None, self_attention=self_attention)


class EncoderLayer(nn.Module):
    """Multi-head self-attention, then the feed-forward network, each wrapped in `Residual`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(config, self_attention=True)
        self.feed_forward = FeedForward(config.d_model, config.d_ff, config.activation)
        self.residual_attn = Residual(config)
        self.residual_ff = Residual(config)

    def forward(self, x: Tensor, mask: Optional[Tensor], need_weights: bool = False):
        """x: (B, S, d_model); mask: (B, 1, 1, S). Returns (x, self-attention weights or None)."""
        x, weights = self.residual_attn(x, lambda y: self.self_attn(y, y, y, mask, need_weights))
        x, _ = self.residual_ff(x, lambda y: (self.feed_forward(y), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention (absent in a decoder-only model), then the
    feed-forward network, each wrapped in `Residual` (§3.1)."""

    def __init__(self, config: ModelConfig, cross_attention: bool = True) -> None:
        super().__init__()
        self.self_attn = _attention(config, self_attention=True)
        self.cross_attn = _attention(config, self_attention=False) if cross_attention else None
        self.feed_forward = FeedForward(config.d_model, config.d_ff, config.activation)
        self.residual_self = Residual(config)
        self.residual_cross = Residual(config) if cross_attention else None
        self.residual_ff = Residual(config)

    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor] = None,
        memory_mask: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        index: int = 0,
        need_weights: bool = False,
    ):
        """x: (B, T, d_model); memory: (B, S, d_model); memory_mask: (B, 1, 1, S). Self-attention is
        causal (§3.2.3). With a cache, x holds only the new positions, `index` is this layer's
        number in it, and the memory's keys and values and its mask come from the cache.
        Returns (x, (self weights, cross weights))."""

        def self_attention(y: Tensor):
            if cache is None:
                return self.self_attn(y, y, y, need_weights=need_weights, causal=True)
            q, k, v = self.self_attn.projections(y)  # (B, h, T, d) each
            k, v = cache.append(index, k, v)  # (B, h, T_total, d)
            return self.self_attn.attend(q, k, v, cache.self_mask, need_weights, causal=True)

        def cross_attention(y: Tensor):
            if cache is None:
                return self.cross_attn(y, memory, memory, memory_mask, need_weights)
            return self.cross_attn(y, mask=cache.memory_mask, need_weights=need_weights, keys_values=cache.cross[index])

        x, self_weights = self.residual_self(x, self_attention)
        cross_weights = None
        if self.cross_attn is not None:
            x, cross_weights = self.residual_cross(x, cross_attention)
        x, _ = self.residual_ff(x, lambda y: (self.feed_forward(y), None))
        return x, (self_weights, cross_weights)


# --------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder stacks


class Encoder(nn.Module):
    """Embeddings + positions + dropout (§5.4), then N encoder layers. Pre-norm adds a final
    LayerNorm; post-norm, as the paper, has none (each layer already ends in one)."""

    def __init__(self, config: ModelConfig, embed: Embeddings) -> None:
        super().__init__()
        self.embed = embed
        self.positions = PositionalEncoding(config)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(self, src: Tensor, mask: Optional[Tensor], need_weights: bool = False):
        """src: (B, S) token ids -> (memory (B, S, d_model), [per layer (B, h, S, S) or None])."""
        x = self.dropout(self.positions(self.embed(src)))  # (B, S, d_model)
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


class Decoder(nn.Module):
    """Embeddings + positions + dropout, then N decoder layers (and a final LayerNorm in pre-norm
    mode). With a KV cache, `tgt` holds only the new tokens and positions continue from the cache.

    Target padding needs no mask: targets are padded on the right, so under the causal mask a real
    token never sees a pad, and the pads' own outputs carry no loss. Causal-only self-attention
    lets SDPA take its `is_causal` path instead of reading a (B, 1, T, T) mask.
    """

    def __init__(self, config: ModelConfig, embed: Embeddings, cross_attention: bool = True) -> None:
        super().__init__()
        self.embed = embed
        self.positions = PositionalEncoding(config)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderLayer(config, cross_attention) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(
        self,
        tgt: Tensor,
        memory: Optional[Tensor] = None,
        memory_mask: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        need_weights: bool = False,
    ):
        """tgt: (B, T) -> (hidden (B, T, d_model), [per layer (self weights, cross weights)])."""
        start = 0 if cache is None else cache.positions(tgt.size(1))  # an int, or (B,) per row
        end = None if cache is None else cache.positions_end(tgt.size(1))
        x = self.dropout(self.positions(self.embed(tgt), start, end))  # (B, T, d_model)
        all_weights = []
        for index, layer in enumerate(self.layers):
            x, weights = layer(x, memory, memory_mask, cache, index, need_weights)
            all_weights.append(weights)
        if cache is not None:
            cache.advance(tgt.size(1))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


# --------------------------------------------------------------------------------------------
# The models


class _Model(nn.Module):
    """What the three model families share: saving, loading, initialisation, the output projection."""

    config: ModelConfig

    def save(self, directory: Union[str, Path], force: bool = False) -> None:
        save_model(self, directory, force=force)  # (aiayn.checkpoint: beside a tokenizer; a model there only with force)

    @classmethod
    def load(cls, directory: Union[str, Path], device: Union[str, torch.device] = "cpu"):
        """In eval mode, as transformers' from_pretrained (found in review: dropout on): .train() to train."""
        return load_model(cls, directory, device).eval()

    def _output_projection(self) -> Optional[nn.Linear]:
        """None when the pre-softmax projection is tied to the embedding (§3.4)."""
        if self.config.tie_output:
            return None
        return nn.Linear(self.config.d_model, self.config.vocab_size, bias=False)

    def _logits_bias(self) -> None:
        """Marian adds a bias to the logits that it never trains: a buffer, saved with the weights."""
        self.register_buffer("logits_bias", torch.zeros(self.config.vocab_size) if self.config.final_logits_bias else None)

    def _logits(self, hidden: Tensor, embed: Embeddings) -> Tensor:
        """The pre-softmax linear transformation: (..., d_model) -> (..., vocab_size)."""
        if self.output_proj is None:
            table = _PaddingRowKept.apply(embed.weight, self.config.pad_id) if torch.is_grad_enabled() else embed.weight
            return F.linear(hidden, table, self.logits_bias)  # a decoding step skips the Function: no backward
        logits = self.output_proj(hidden)  # a module: an int8 copy (aiayn.inference) holds no float weight
        return logits if self.logits_bias is None else logits + self.logits_bias

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())

    def _init_weights(self) -> None:
        """Xavier-uniform projections and N(0, d_model^-0.5) embeddings, as tensor2tensor and
        fairseq do; the paper does not state its initialisation."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "lookup" not in name and "positions" not in name:
                nn.init.xavier_uniform_(p)
            elif "bias" in name:
                nn.init.zeros_(p)
        for module in self.modules():
            if isinstance(module, Embeddings):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
                with torch.no_grad():
                    module.weight[self.config.pad_id].zero_()
            elif isinstance(module, PositionalEncoding) and module.kind == "learned":
                nn.init.normal_(module.table.weight, mean=0.0, std=self.config.d_model**-0.5)


class Transformer(_Model):
    """The encoder-decoder model of §3 (Figure 1).

    `forward(src, tgt)` is teacher forcing: tgt is the decoder input, the reference shifted right
    (it starts with BOS), and the logits at position t predict target token t + 1.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        src_embed = Embeddings(config)
        tgt_embed = src_embed if config.share_embeddings else Embeddings(config)
        self.encoder = Encoder(config, src_embed)
        self.decoder = Decoder(config, tgt_embed)
        self.output_proj = self._output_projection()
        self._logits_bias()
        self._init_weights()

    def source_mask(self, src: Tensor) -> Tensor:
        return (src != self.config.pad_id)[:, None, None, :]  # (B, 1, 1, S)

    def encode(self, src: Tensor, check_range: bool = True) -> tuple[Tensor, Tensor]:
        """src: (B, S) token ids -> (memory (B, S, d_model), source mask (B, 1, 1, S)).
        `check_range` false: the caller has checked that the ids are in the vocabulary."""
        check_tokens("src", src, self.config.vocab_size, check_range)
        mask = self.source_mask(src)
        memory, _ = self.encoder(src, mask)
        return memory, mask

    def decode(
        self,
        tgt: Tensor,
        memory: Optional[Tensor] = None,
        memory_mask: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        positions: Optional[Tensor] = None,
        check_range: bool = True,
    ) -> Tensor:
        """tgt: (B, T) decoder input; memory: (B, S, d_model), memory_mask: `encode`'s, needed
        wherever the sources are padded (else padding is attended to) -> logits (B, T, vocab_size).
        With a cache (from `init_cache`), tgt holds only the tokens not yet seen, usually one per
        row, and the memory is not needed: its keys, values and mask are in the cache.
        With `positions`, (N,) indices into the B·T target positions taken row by row, only
        those positions' logits come out, (N, vocab_size): training scores the positions that
        hold a target token and skips the padding's share of the pre-softmax projection."""
        check_tokens("tgt", tgt, self.config.vocab_size, check_range=check_range)
        if cache is None and memory is None:
            raise ValueError("decode needs the encoder's memory, or a cache from init_cache")
        if cache is None and tgt.size(0) != memory.size(0):
            raise ValueError(f"src and tgt batch sizes differ: {memory.size(0)} vs {tgt.size(0)}")
        hidden, _ = self.decoder(tgt, memory, memory_mask, cache)  # (B, T, d_model)
        if positions is not None:
            check_positions(positions, hidden.size(0) * hidden.size(1), check_range)
            hidden = hidden.flatten(0, 1).index_select(0, positions)  # (N, d_model)
        return self._logits(hidden, self.decoder.embed)

    def forward(self, src: Tensor, tgt: Tensor, positions: Optional[Tensor] = None, check_range: bool = True) -> Tensor:
        """src: (B, S), tgt: (B, T) -> logits (B, T, vocab_size), or (N, vocab_size) for the
        (N,) flat target `positions` only (see `decode`). `check_range` false: the caller has
        checked that the ids are in the vocabulary (`check_tokens`)."""
        memory, mask = self.encode(src, check_range)
        return self.decode(tgt, memory, mask, positions=positions, check_range=check_range)

    def next_log_probs(self, tokens: Tensor, cache) -> Tensor:
        """tokens: (B,) each row's newest token, one decoding step on `cache` (a KVCache, or
        aiayn.graphs' static one) -> log-probabilities of the next token (B, V), in fp32. The tokens
        are the search's own, so not checked against the vocabulary (a check waits for a GPU)."""
        log_probs = torch.log_softmax(self.decode(tokens.unsqueeze(1), cache=cache, check_range=False)[:, -1], -1, torch.float32)
        log_probs[:, self.config.pad_id] = float("-inf")  # padding is no word (CTranslate2 has no row for it)
        return log_probs  # (B, V)

    def init_cache(self, memory: Tensor, memory_mask: Optional[Tensor], max_len: int, beam: int = 1) -> KVCache:
        """The decoding state for up to `max_len` target positions against `memory` (B, S, d_model):
        the encoder-decoder keys and values of every layer, computed here once per sentence, and
        empty self-attention buffers. `beam`: the beam size of the search that will use it."""
        d_k, d_v = self.config.head_dims
        cross = self.memory_keys_values(memory)
        return KVCache(
            self.config.n_layers, memory.size(0), self.config.n_heads, d_k, d_v, max_len,
            cache_dtype(self, memory, beam), memory.device, cross, memory_mask,
        )

    def memory_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's encoder-decoder keys and values of `memory` (B, S, d_model):
        [((B, h, S, d_k), (B, h, S, d_v))] per layer, what a decoding state keeps of a sentence."""
        return [layer.cross_attn.keys_values(memory, memory) for layer in self.decoder.layers]

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt: Tensor) -> dict[str, list[Tensor]]:
        """The attention weights of every layer and head, for Figures 3-5 of the paper.

        Returns {"encoder": [(B, h, S, S)] * N, "decoder": [(B, h, T, T)] * N, "cross": [(B, h, T, S)] * N}.
        """
        if self.training:  # dropout would make every call's maps differ (found in review)
            raise ValueError("attention_maps needs the model in eval mode: call model.eval() first")
        check_tokens("src", src, self.config.vocab_size)
        check_tokens("tgt", tgt, self.config.vocab_size)
        mask = self.source_mask(src)
        memory, encoder_weights = self.encoder(src, mask, need_weights=True)
        _, decoder_weights = self.decoder(tgt, memory, mask, need_weights=True)
        return {"encoder": encoder_weights, "decoder": [w[0] for w in decoder_weights], "cross": [w[1] for w in decoder_weights]}


class EncoderModel(_Model):
    """Encoder only (the BERT family of the lecture): bidirectional self-attention over the whole
    input. `forward` returns logits over the vocabulary through the tied embedding, as a masked
    language model head; `encode` returns the hidden states."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, Embeddings(config))
        self.output_proj = self._output_projection()
        self._logits_bias()
        self._init_weights()

    def encode(self, tokens: Tensor) -> Tensor:
        """tokens: (B, L) -> hidden states (B, L, d_model)."""
        check_tokens("tokens", tokens, self.config.vocab_size)
        hidden, _ = self.encoder(tokens, (tokens != self.config.pad_id)[:, None, None, :])
        return hidden

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens: (B, L) -> logits over the vocabulary at every position (B, L, vocab_size), as
        a masked language model's head reads them."""
        return self._logits(self.encode(tokens), self.encoder.embed)  # (B, L, vocab_size)


class DecoderModel(_Model):
    """Decoder only (the GPT family of the lecture): masked self-attention and the feed-forward
    network, no encoder-decoder attention. `forward(tokens)` gives next-token logits; with a KV
    cache from `init_cache`, tokens holds only the new positions."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = Decoder(config, Embeddings(config), cross_attention=False)
        self.output_proj = self._output_projection()
        self._logits_bias()
        self._init_weights()

    def forward(self, tokens: Tensor, cache: Optional[KVCache] = None, check_range: bool = True) -> Tensor:
        """tokens: (B, T) -> logits (B, T, vocab_size). `check_range` false: the caller has checked
        the ids (a loop's own tokens; on a GPU the check waits for the device at every step)."""
        check_tokens("tokens", tokens, self.config.vocab_size, check_range=check_range)
        hidden, _ = self.decoder(tokens, cache=cache)
        return self._logits(hidden, self.decoder.embed)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        d_k, d_v = self.config.head_dims
        p = self.decoder.embed.weight
        return KVCache(self.config.n_layers, batch, self.config.n_heads, d_k, d_v, max_len, p.dtype, p.device)
