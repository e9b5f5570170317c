"""Scaled dot-product attention and multi-head attention (§3.2 of the paper).

Mask convention, everywhere in aiayn: a boolean tensor where True means "may attend", the same
polarity as `torch.nn.functional.scaled_dot_product_attention`. Masked scores become -inf before
the softmax (§3.2.3), so they receive exactly zero weight.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn import kernels
from aiayn.kernels import attention_mask


def _broadcast(*shapes: torch.Size) -> Optional[torch.Size]:
    """The shape `shapes` broadcast to, or None where they do not: torch.broadcast_shapes in plain
    Python, because torch's took 10-16 µs a call, and checking a decoding step's six attention
    calls was 8% of the step (a beam search of one sentence, the demo model, AMD EPYC Zen 5).
    A compiled step traces torch's, which compares symbolic sizes without guarding on them."""
    if torch.compiler.is_compiling():
        try:
            return torch.broadcast_shapes(*shapes)
        except RuntimeError:
            return None
    rank = max(len(shape) for shape in shapes)
    out = []
    for sizes in zip(*((1,) * (rank - len(shape)) + tuple(shape) for shape in shapes)):
        other = {size for size in sizes if size != 1}
        if len(other) > 1:
            return None
        out.append(other.pop() if other else 1)
    return torch.Size(out)


def _check_mask(mask: Optional[Tensor], scores_shape: torch.Size) -> None:
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask must be a bool tensor (True = may attend), got {mask.dtype}")
    if _broadcast(mask.shape, scores_shape) != scores_shape:
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)} (..., query length, key length)"
        )


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> torch.Size:
    """Validate shapes and return the shape of the score matrix QKᵀ."""
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError("q, k and v need at least 2 dimensions (..., length, features)")
    if q.size(-1) != k.size(-1):
        raise ValueError(f"queries and keys must share d_k, got {q.size(-1)} and {k.size(-1)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"keys and values must have the same length, got {k.size(-2)} and {v.size(-2)}")
    batch = _broadcast(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if batch is None:
        raise ValueError(
            f"q, k, v batch dimensions do not broadcast: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    return torch.Size((*batch, q.size(-2), k.size(-2)))


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V, the reference math of §3.2.1.

    q: (..., L_q, d_k), k: (..., L_k, d_k), v: (..., L_k, d_v); mask: bool, broadcastable to
    (..., L_q, L_k), True = may attend. Returns (output (..., L_q, d_v), weights (..., L_q, L_k)).
    A query whose keys are all masked gets zero weights and a zero output (as PyTorch's fused
    kernels do) rather than NaN.
    """
    scores_shape = _check_qkv(q, k, v)
    _check_mask(mask, scores_shape)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., L_q, L_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., L_q, L_k)
    if mask is not None:
        # softmax of an all -inf row is NaN; such a query attends to nothing.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., L_q, d_v), (..., L_q, L_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K, VW_i^V).

    §3.2.2. The h projections W_i^Q (d_model × d_k) are stored side by side in one
    `nn.Linear(d_model, h·d_k)`: columns [i·d_k, (i+1)·d_k) of its (transposed) weight are W_i^Q.
    Likewise for W^K and W^V (d_v); W^O is `nn.Linear(h·d_v, d_model)`. d_k and d_v are free
    (Table 3 rows A, B); they default to d_model / h.

    With a `neighborhood` r (self-attention only) each position attends to those within r // 2
    of it (restricted self-attention, Table 1). `self_attention` says that queries, keys and
    values are projections of one input (§3.2.3), which a decoding copy (aiayn.inference) then
    computes in one product; in encoder-decoder attention only the keys and values are.
    aiayn.kernels computes the attention; with `need_weights=True` the reference math runs
    instead and the per-head weights are returned (never stored).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: Optional[int] = None,
        d_v: Optional[int] = None,
        dropout: float = 0.0,
        bias: bool = False,
        neighborhood: Optional[int] = None,
        self_attention: bool = True,
    ) -> None:
        super().__init__()
        if n_heads < 1 or d_model < 1:  # (n_heads 0 was a ZeroDivisionError)
            raise ValueError(f"MultiHeadAttention needs d_model and n_heads of at least 1, got {d_model} and {n_heads}")
        if (d_k is None or d_v is None) and d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_k and d_v explicitly"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_k or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        self.dropout = dropout
        self.neighborhood = neighborhood
        self.self_attention = self_attention  # queries, keys and values from one input (§3.2.3)
        self.w_q = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.w_k = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.w_v = nn.Linear(d_model, n_heads * self.d_v, bias=bias)
        self.w_o = nn.Linear(n_heads * self.d_v, d_model, bias=bias)
        # A packed or int8 decoding copy (aiayn.inference) computes projections of one input as one product:
        # W^Q, W^K, W^V side by side (self-attention) or W^K, W^V (encoder-decoder attention).
        self.w_qkv: Optional[nn.Module] = None
        self.w_kv: Optional[nn.Module] = None

    def _split_heads(self, x: Tensor, d_head: int) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, d_head).transpose(1, 2)  # (B, h, L, d_head)

    def _split_product(self, x: Tensor, *d_heads: int) -> list[Tensor]:
        """One product of projections side by side (B, L, h·Σ d_heads) -> each in heads, (B, h, L, d)."""
        parts = x.split([self.n_heads * d for d in d_heads], dim=-1)
        return [self._split_heads(part, d) for part, d in zip(parts, d_heads)]

    def _check_input(self, name: str, x: Tensor) -> None:
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(
                f"{name} must have shape (batch, length, d_model={self.d_model}), got {tuple(x.shape)}"
            )

    def keys_values(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Project keys and values into heads: (B, h, L_k, d_k), (B, h, L_k, d_v).

        Split out so that the decoder can compute the encoder-decoder keys once per sentence and
        keep them in the KV cache (aiayn.cache).
        """
        self._check_input("key", key)
        self._check_input("value", value)
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key and value shapes differ: {tuple(key.shape)} vs {tuple(value.shape)}")
        if value is key:
            key = value = kernels.autocast_input(key)
            if self.w_kv is not None:
                k, v = self._split_product(self.w_kv(key), self.d_k, self.d_v)
                return k, v
        return self._split_heads(self.w_k(key), self.d_k), self._split_heads(self.w_v(value), self.d_v)

    def projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries, keys and values of one input x (B, L, d_model), in heads:
        (B, h, L, d_k), (B, h, L, d_k), (B, h, L, d_v)."""
        self._check_input("query", x)
        x = kernels.autocast_input(x)
        if self.w_qkv is None:
            return (self._split_heads(self.w_q(x), self.d_k), *self.keys_values(x, x))
        q, k, v = self._split_product(self.w_qkv(x), self.d_k, self.d_k, self.d_v)
        return q, k, v

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        keys_values: Optional[tuple[Tensor, Tensor]] = None,
        causal: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """query: (B, L_q, d_model); key, value: (B, L_k, d_model), or `keys_values` already
        projected (from `keys_values()` or the cache). mask: bool, broadcastable to
        (B, h, L_q, L_k). `causal`: no query sees a later position, the queries being the last
        L_q of the L_k positions (see `attention_mask`).
        Returns (output (B, L_q, d_model), weights (B, h, L_q, L_k) or None).
        """
        if keys_values is None and query is key and key is value:
            q, k, v = self.projections(query)  # (B, h, L, d_k), (B, h, L, d_k), (B, h, L, d_v)
        else:
            self._check_input("query", query)
            if keys_values is None:
                if key is None or value is None:
                    raise ValueError("pass key and value, or keys_values")
                keys_values = self.keys_values(key, value)
            k, v = keys_values  # (B / g, h, L_k, d_k), (B / g, h, L_k, d_v)
            q = self._split_heads(self.w_q(query), self.d_k)  # (B, h, L_q, d_k)
        return self.attend(q, k, v, mask, need_weights, causal)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, need_weights: bool = False,
        causal: bool = False,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """The heads' attention and W^O, from projected queries q (B, h, L_q, d_k), keys
        k (B / g, h, L_k, d_k) and values v (B / g, h, L_k, d_v); `mask`, `need_weights` and
        `causal` as in `forward`. Returns (output (B, L_q, d_model), weights (B, h, L_q, L_k) or None)."""
        batch, kv_rows, row_len = q.size(0), k.size(0), q.size(2)
        group = batch // kv_rows if kv_rows else 1  # (no rows of keys: an empty batch, found in review)
        if group > 1:
            # g consecutive query rows share one row of keys and values (the beams of a sentence,
            # aiayn.cache): stack their queries as g·L_q positions of that row; no row sees another.
            if causal or self.neighborhood is not None or batch != group * kv_rows:
                raise ValueError(f"{batch} query rows cannot share {kv_rows} rows of keys and values")
            q = kernels.fold_queries(q, kv_rows)  # (B / g, h, g·L_q, d_k)
        dropout_p = self.dropout if self.training else 0.0
        q_len, k_len = q.size(-2), k.size(-2)
        scores_shape = _check_qkv(q, k, v)
        _check_mask(mask, scores_shape)
        kernel = None if need_weights else kernels.attention_kernel(q, k, mask, self.neighborhood)
        if kernel is None:  # the reference math of §3.2.1, in the keys' dtype (an int8 model's bf16 cache, as the kernels)
            full_mask = attention_mask(mask, causal, self.neighborhood, q_len, k_len, q.device)
            heads, weights = scaled_dot_product_attention(q.to(k.dtype), k, v, full_mask, dropout_p)  # (B, h, L_q, d_v), (B, h, L_q, L_k)
            heads, weights = heads.to(q.dtype), weights if need_weights else None
        else:
            heads, weights = kernel(q, k, v, mask, causal, dropout_p), None  # (B, h, L_q, d_v)
        if group > 1:  # back to one row per query row
            heads = kernels.unfold_queries(heads, batch)  # (B, h, L_q, d_v)
            weights = None if weights is None else kernels.unfold_queries(weights, batch)  # (B, h, L_q, L_k)
        concat = heads.transpose(1, 2).reshape(batch, row_len, self.n_heads * self.d_v)  # (B, L_q, h·d_v)
        return self.w_o(concat), weights  # (B, L_q, d_model)
