"""Counting the arithmetic of a Transformer, for model FLOPs utilisation (MFU), and the memory a
training step holds at its peak (`training_peak_bytes`).

Only matrix products are counted (a multiply-add is 2 FLOPs), as nanoGPT's `estimate_mfu` and
the PaLM paper do; LayerNorm, softmax and the like are a small remainder. The backward pass costs
twice the forward, so one training step costs 3x the forward FLOPs.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

from aiayn.config import ModelConfig, TrainConfig
from aiayn.device import available_bytes


def _attention_flops(config: ModelConfig, queries: int, keys: int, pairs: Optional[float] = None) -> int:
    """One multi-head attention sub-layer: queries attend over keys (§3.2.2), `pairs` of them
    scored (all queries × keys unless restricted)."""
    d, h = config.d_model, config.n_heads
    d_k, d_v = config.head_dims
    projections = 2 * queries * d * h * d_k + 2 * keys * d * h * (d_k + d_v) + 2 * queries * h * d_v * d
    pairs = queries * keys if pairs is None else pairs
    scores_and_sum = 2 * pairs * h * (d_k + d_v)  # QKᵀ, then weights · V
    return projections + scores_and_sum


def _self_attention_pairs(config: ModelConfig, length: float) -> float:
    """(query, key) pairs self-attention scores over `length` positions: all length², or with a
    neighbourhood r (Table 1's restricted self-attention) those with |i - j| ≤ r // 2, which is
    O(n·r). As the unrestricted count ignores the decoder's causal mask, so does this one."""
    if config.neighborhood is None or length <= config.neighborhood // 2 + 1:
        return length * length
    half = config.neighborhood // 2
    return length * (2 * half + 1) - half * (half + 1)  # the band, less the corners cut at both ends


def _ffn_flops(config: ModelConfig, length: int) -> int:
    """The feed-forward network's two linear maps over `length` positions (§3.3)."""
    return 4 * length * config.d_model * config.d_ff


def forward_flops(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    """FLOPs of one forward pass over a sentence pair of the given lengths, logits included."""
    ffn = functools.partial(_ffn_flops, config)
    self_attention = lambda length: _attention_flops(config, length, length, _self_attention_pairs(config, length))  # noqa: E731
    encoder_layer = self_attention(src_len) + ffn(src_len)
    decoder_layer = self_attention(tgt_len) + _attention_flops(config, tgt_len, src_len) + ffn(tgt_len)
    logits = 2 * tgt_len * config.d_model * config.vocab_size
    return config.n_layers * (encoder_layer + decoder_layer) + logits


def decoder_step_flops(config: ModelConfig, length: int, src_len: int) -> int:
    """FLOPs of one step of incremental decoding (§3.1: auto-regressive) for one row: its newest
    position through every decoder layer, attending over the `length` positions decoded so far (its
    own included) and `src_len` source positions whose keys and values a KV cache holds (computed
    once per sentence, not counted here), and its logits."""
    d_k, d_v = config.head_dims
    cached = lambda keys: 2 * keys * config.d_model * config.n_heads * (d_k + d_v)  # noqa: E731  projections spared
    seen = length if config.neighborhood is None else min(length, config.neighborhood // 2 + 1)  # restricted: the last r // 2 + 1
    self_attention = _attention_flops(config, 1, length, seen) - cached(length - 1)  # only the newest key is projected
    cross_attention = _attention_flops(config, 1, src_len) - cached(src_len)
    return config.n_layers * (self_attention + cross_attention + _ffn_flops(config, 1)) + 2 * config.d_model * config.vocab_size


def training_flops(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    """Forward + backward FLOPs of one sentence pair (backward ≈ 2 × forward)."""
    return 3 * forward_flops(config, src_len, tgt_len)


# A step of eager training on a CPU, per padded token of --max-tokens: a pair of layers (encoder
# and decoder) keeps about 150 bytes per unit of d_model and 16 per unit of d_ff, the output
# layer about 10 per word of the vocabulary; fitted to `aiayn train`'s peak resident set
# (benchmarks/train_peak.py, fp32, results/train-peak-*.json), which it meets within a fifth. For
# base at 25,000 tokens (a vocabulary of 8,000) it gives 18.2 GiB; speed.py measured 18.5 (Zen 5).
LAYER_BYTES_PER_D_MODEL, LAYER_BYTES_PER_D_FF, OUTPUT_BYTES_PER_WORD = 150, 16, 10
AUTOCAST_ACTIVATIONS = 0.8  # bf16 autocast keeps some in 16 bits: base peaked at 14.9 GiB against fp32's 18.5
PROCESS_BYTES = 300 * 2**20  # Python, PyTorch, the tokenizer and the data


def _peak_parts(config: ModelConfig, precision: str) -> tuple[int, float]:
    """(the bytes a training step holds whatever its batch, those it adds per padded token)."""
    from aiayn.checkpoint import meta_model  # shapes only: even `big` costs no memory
    from aiayn.model import Transformer

    per_token = (config.n_layers * (LAYER_BYTES_PER_D_MODEL * config.d_model + LAYER_BYTES_PER_D_FF * config.d_ff)
                 + OUTPUT_BYTES_PER_WORD * config.vocab_size)
    if precision in ("bf16", "fp16"):
        per_token *= AUTOCAST_ACTIVATIONS
    return PROCESS_BYTES + 16 * meta_model(Transformer, config).num_parameters(), per_token


def training_peak_bytes(config: ModelConfig, max_tokens: int, precision: str = "fp32") -> int:
    """About the most memory a training step at batches of `max_tokens` padded tokens (source and
    target each) holds: the process, fp32 weights, gradients and Adam's two moments (16 bytes a
    parameter), and the activations the backward pass needs."""
    fixed, per_token = _peak_parts(config, precision)
    return int(fixed + max_tokens * per_token)


def memory_warning(config: ModelConfig, recipe: TrainConfig, device: torch.device) -> Optional[str]:
    """A line for a run on a CPU whose steps, in every process of this machine (torchrun's
    LOCAL_WORLD_SIZE), may need more memory than the system can give now, with the --max-tokens
    and --accumulate that make the same batch in parts that fit; else None. A warning, not a
    refusal: the estimate is within a fifth, and the kernel kills the process without a word."""
    if device.type != "cpu" or (available := available_bytes()) is None:
        return None
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    processes = int(local) if local.isdigit() and int(local) > 0 else 1
    fixed, per_token = _peak_parts(config, recipe.precision)  # once: the parts are tried below
    need = lambda tokens: processes * int(fixed + tokens * per_token)  # noqa: E731  training_peak_bytes
    if need(recipe.max_tokens) <= available:
        return None
    parts = next((k for k in (2, 4, 8, 16, 32, 64) if need(recipe.max_tokens // k) <= available), None)
    advice = ("a smaller model" if parts is None else f"--max-tokens {recipe.max_tokens // parts:,} --accumulate "
              f"{recipe.accumulate * parts} makes the same batch in parts of about {need(recipe.max_tokens // parts) / 2**30:.1f} GiB")
    return (f"warning: this run may not fit in memory: its steps need about {need(recipe.max_tokens) / 2**30:.1f} GiB"
            f"{f' over {processes} processes' if processes > 1 else ''} at --max-tokens {recipe.max_tokens:,}, and the "
            f"system has {available / 2**30:.1f} GiB free (the kernel would kill it); {advice}")
