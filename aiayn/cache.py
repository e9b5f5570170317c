"""The decoding state: keys and values kept across steps of incremental decoding.

At inference the decoder produces one token per step (§3.1: "auto-regressive"). Re-running the
whole prefix each step repeats work: the keys and values of earlier positions do not change,
because masked self-attention never lets them see later tokens. The cache keeps them:

- decoder self-attention: a buffer per layer, preallocated to `max_len` positions and written at
  the current position, so a step costs one new row instead of a new prefix;
- encoder-decoder attention: the keys and values of the encoder output, computed once per
  sentence by `Transformer.init_cache` and kept once per sentence: the `beam` consecutive rows
  of a sentence share them, so reordering beams within sentences copies nothing of the memory.

State tensors (B = batch rows = M sentences × beam; h = heads; S = source length):
  self_k[i]: (B, h, max_len, d_k)    self_v[i]: (B, h, max_len, d_v)
  cross[i]:  ((M, h, S, d_k), (M, h, S, d_v)), or absent in a decoder-only model
  memory_mask: (M, 1, 1, S) bool, True = may attend, or None
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
        cross: Optional[list[tuple[Tensor, Tensor]]] = None,
        memory_mask: Optional[Tensor] = None,
    ) -> None:
        self.max_len = max_len
        self.length = 0
        self.self_k = [torch.zeros(batch, n_heads, max_len, d_k, dtype=dtype, device=device) for _ in range(n_layers)]
        self.self_v = [torch.zeros(batch, n_heads, max_len, d_v, dtype=dtype, device=device) for _ in range(n_layers)]
        # Contiguous once: as the heads' views of the projections they are strided, and every
        # step's QKᵀ would copy them (3-5× the cost of the product itself on a CPU).
        self.cross = [(k.contiguous(), v.contiguous()) for k, v in cross or []]
        self.memory_mask = memory_mask
        # Buffers that `reorder` writes into, then swaps with those in use.
        self._spare_k: list[Optional[Tensor]] = [None] * n_layers
        self._spare_v: list[Optional[Tensor]] = [None] * n_layers

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

    def _select(self, buffers: list[Tensor], spares: list[Optional[Tensor]], indices: Tensor) -> None:
        """buffers[i] = buffers[i].index_select(0, indices), written into spares[i], which then
        swaps roles with the old buffer. Only the positions written so far are copied: the copy
        is memory-bound, and a buffer holds max_len positions while a sentence has `length`.
        Beam search reorders every step; a fresh allocation of these megabytes each time costs
        more than the copy (new pages from the system)."""
        rows = indices.numel()
        for i, buf in enumerate(buffers):
            if buf.requires_grad:  # out= cannot record a gradient
                buffers[i] = buf.index_select(0, indices)
                continue
            spare = spares[i]
            if spare is None or spare.size(0) < rows:
                spare = torch.empty((rows, *buf.shape[1:]), dtype=buf.dtype, device=buf.device)
            torch.index_select(buf[:, :, : self.length], 0, indices, out=spare[:rows, :, : self.length])
            buffers[i], spares[i] = spare[:rows], buf

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        """Continue with batch rows `rows` (LongTensor (M'·beam,)), sentence-major: rows
        [j·beam, (j+1)·beam) are the beams of sentence `sentences[j]` (LongTensor (M',), indices
        of the sentences now in the cache, increasing). Beam search passes its survivors' parents
        and the sentences still decoding; greedy passes the same indices twice, beam 1.

        The self-attention buffers are index_selected; the memory's keys, values and mask only
        when sentences leave."""
        if rows.numel() != sentences.numel() * beam:
            raise ValueError(f"{rows.numel()} rows are not {sentences.numel()} sentences × beam {beam}")
        self._select(self.self_k, self._spare_k, rows)
        self._select(self.self_v, self._spare_v, rows)
        memory_rows = self.cross[0][0].size(0) if self.cross else None
        if memory_rows is None or sentences.numel() == memory_rows:
            return  # the same sentences (increasing indices): their memory rows stay as they are
        self.cross = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.cross]
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, sentences)
