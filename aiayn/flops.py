"""Counting the arithmetic of a Transformer, for model FLOPs utilisation (MFU).

Only matrix products are counted (a multiply-add is 2 FLOPs), as nanoGPT's `estimate_mfu` and
the PaLM paper do; LayerNorm, softmax and the like are a small remainder. The backward pass costs
twice the forward, so one training step costs 3x the forward FLOPs.
"""

from __future__ import annotations

from aiayn.config import ModelConfig


def _attention_flops(config: ModelConfig, queries: int, keys: int) -> int:
    """One multi-head attention sub-layer: queries attend over keys (§3.2.2)."""
    d, h = config.d_model, config.n_heads
    d_k, d_v = config.head_dims
    projections = 2 * queries * d * h * d_k + 2 * keys * d * h * (d_k + d_v) + 2 * queries * h * d_v * d
    scores_and_sum = 2 * queries * keys * h * (d_k + d_v)  # QKᵀ, then weights · V
    return projections + scores_and_sum


def forward_flops(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    """FLOPs of one forward pass over a sentence pair of the given lengths, logits included."""
    ffn = lambda length: 4 * length * config.d_model * config.d_ff  # noqa: E731  two linear maps
    encoder_layer = _attention_flops(config, src_len, src_len) + ffn(src_len)
    decoder_layer = (
        _attention_flops(config, tgt_len, tgt_len) + _attention_flops(config, tgt_len, src_len) + ffn(tgt_len)
    )
    logits = 2 * tgt_len * config.d_model * config.vocab_size
    return config.n_layers * (encoder_layer + decoder_layer) + logits


def training_flops(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    """Forward + backward FLOPs of one sentence pair (backward ≈ 2 × forward)."""
    return 3 * forward_flops(config, src_len, tgt_len)
