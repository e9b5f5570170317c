"""Key/value cache for incremental (token by token) decoding.

At inference the decoder produces one token per step (§3.1: "auto-regressive"). Re-running the
whole prefix each step repeats work: the keys and values of earlier positions do not change,
because masked self-attention never lets them see later tokens. The cache keeps them:

- decoder self-attention: a buffer per layer, preallocated to `max_len` positions and written at
  the current position, so a step costs one new row instead of a new prefix;
- encoder-decoder attention: keys and values of the encoder output, computed once per sentence.

State tensors (B = batch rows, e.g. sentences × beams; h = heads; S = source length):
  self_k[i]: (B, h, max_len, d_k)    self_v[i]: (B, h, max_len, d_v)
  cross[i]:  ((B, h, S, d_k), (B, h, S, d_v)) or None before layer i first runs
  memory_mask: (B, 1, 1, S) bool, True = may attend, or None
  length: number of target positions already written (the same for every row)
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class KVCache:
    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_heads: int,
        d_k: int,
        d_v: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        memory_mask: Optional[Tensor] = None,
    ) -> None:
        self.max_len = max_len
        self.length = 0
        self.self_k = [torch.zeros(batch, n_heads, max_len, d_k, dtype=dtype, device=device) for _ in range(n_layers)]
        self.self_v = [torch.zeros(batch, n_heads, max_len, d_v, dtype=dtype, device=device) for _ in range(n_layers)]
        self.cross: list[Optional[tuple[Tensor, Tensor]]] = [None] * n_layers
        self.memory_mask = memory_mask

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys/values of `layer`; return all positions written so far.

        k: (B, h, t, d_k), v: (B, h, t, d_v) -> (B, h, length + t, d_k), (B, h, length + t, d_v)
        """
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; decoding needs {end}")
        self.self_k[layer][:, :, self.length : end] = k
        self.self_v[layer][:, :, self.length : end] = v
        return self.self_k[layer][:, :, :end], self.self_v[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        """Move the write position on once every layer has appended `steps` positions."""
        self.length += steps

    def reorder(self, indices: Tensor) -> None:
        """Keep batch rows `indices` (LongTensor (B',)), in that order: beam search picks the
        surviving hypotheses' parents and drops finished sentences. One index_select per buffer."""
        self.self_k = [buf.index_select(0, indices) for buf in self.self_k]
        self.self_v = [buf.index_select(0, indices) for buf in self.self_v]
        self.cross = [
            None if kv is None else (kv[0].index_select(0, indices), kv[1].index_select(0, indices))
            for kv in self.cross
        ]
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, indices)
