"""The decoding state: keys and values kept across steps of incremental decoding.

At inference the decoder produces one token per step (§3.1: "auto-regressive"). Re-running the
whole prefix each step repeats work: the keys and values of earlier positions do not change,
because masked self-attention never lets them see later tokens. The cache keeps them:

- decoder self-attention: a buffer per layer, preallocated to `max_len` positions and written at
  the current position, so a step costs one new row instead of a new prefix (after a reorder
  a buffer has room for one more position: see `reorder`);
- encoder-decoder attention: the keys and values of the encoder output, computed once per
  sentence by `Transformer.init_cache` and kept once per sentence: the `beam` consecutive rows
  of a sentence share them, so reordering beams within sentences copies nothing of the memory.

State tensors (B = batch rows = M sentences × beam; h = heads; S = source length):
  self_k[i]: (B, h, capacity, d_k)   self_v[i]: (B, h, capacity, d_v), length ≤ capacity ≤ max_len
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
        self.n_layers = n_layers
        # Each buffer is a view of a flat storage: (B, h, capacity, d), capacity max_len at first.
        # `reorder` writes the survivors into the other storage with room for one more position
        # only, so that after the next append the keys a step attends to are one contiguous block
        # (a strided block costs bf16 matrix products a copy each step on a CPU).
        flat = lambda d: torch.zeros(batch * n_heads * max_len * d, dtype=dtype, device=device)  # noqa: E731
        self._stores = [[flat(d_k), None] for _ in range(n_layers)] + [[flat(d_v), None] for _ in range(n_layers)]
        self._buffers = [store[0].view(batch, n_heads, max_len, -1) for store in self._stores]  # [k of each layer, v of each]
        # Contiguous once: as the heads' views of the projections they are strided, and every
        # step's QKᵀ would copy them (3-5× the cost of the product itself on a CPU).
        self.cross = [(k.to(dtype).contiguous(), v.to(dtype).contiguous()) for k, v in cross or []]
        self.memory_mask = memory_mask

    @property
    def self_k(self) -> list[Tensor]:
        return self._buffers[: self.n_layers]

    @property
    def self_v(self) -> list[Tensor]:
        return self._buffers[self.n_layers :]

    def _move(self, i: int, indices: Optional[Tensor], capacity: int) -> None:
        """Buffer i's rows `indices` (all rows when None), positions written so far, into the
        other storage with room for `capacity` positions; the two storages swap roles."""
        buf, (current, spare) = self._buffers[i], self._stores[i]
        rows = buf.size(0) if indices is None else indices.numel()
        need = rows * buf.size(1) * capacity * buf.size(3)
        if spare is None or spare.numel() < need or buf.requires_grad:  # a graph may hold the old one
            room = rows * buf.size(1) * self.max_len * buf.size(3)  # enough for every later step
            spare = torch.empty(room, dtype=buf.dtype, device=buf.device)
        new = spare[:need].view(rows, buf.size(1), capacity, buf.size(3))
        written = buf[:, :, : self.length]
        if indices is None or buf.requires_grad:  # out= records no gradient
            new[:, :, : self.length] = written if indices is None else written.index_select(0, indices)
        else:
            torch.index_select(written, 0, indices, out=new[:, :, : self.length])
        self._buffers[i], self._stores[i] = new, [spare, current]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys/values of `layer`; return all positions written so far.

        k: (B, h, t, d_k), v: (B, h, t, d_v) -> (B, h, length + t, d_k), (B, h, length + t, d_v)
        """
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; decoding needs {end}")
        out = []
        for i, new in ((layer, k), (self.n_layers + layer, v)):
            if end > self._buffers[i].size(2):  # reordered with room for one position: grow to max_len
                self._move(i, None, self.max_len)
            self._buffers[i][:, :, self.length : end] = new
            out.append(self._buffers[i][:, :, :end])
        return out[0], out[1]

    def advance(self, steps: int) -> None:
        """Move the write position on once every layer has appended `steps` positions."""
        self.length += steps

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        """Continue with batch rows `rows` (LongTensor (M'·beam,)), sentence-major: rows
        [j·beam, (j+1)·beam) are the beams of sentence `sentences[j]` (LongTensor (M',), indices
        of the sentences now in the cache, increasing). Beam search passes its survivors' parents
        and the sentences still decoding; greedy passes the same indices twice, beam 1.

        The self-attention buffers are index_selected, only the positions written so far (the
        copy is memory-bound, and a buffer holds max_len positions while a sentence has
        `length`); the memory's keys, values and mask only when sentences leave. A fresh
        allocation each step would cost more than the copy (new pages from the system), so two
        storages per buffer take turns."""
        if rows.numel() != sentences.numel() * beam:
            raise ValueError(f"{rows.numel()} rows are not {sentences.numel()} sentences × beam {beam}")
        for i in range(len(self._buffers)):
            self._move(i, rows, min(self.length + 1, self.max_len))
        memory_rows = self.cross[0][0].size(0) if self.cross else None
        if memory_rows is None or sentences.numel() == memory_rows:
            return  # the same sentences (increasing indices): their memory rows stay as they are
        self.cross = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.cross]
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, sentences)
