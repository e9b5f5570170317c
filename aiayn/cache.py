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

Sentences may also join a cache that is decoding others (`join`: continuous batching, where a
server's new requests enter the running search between steps). Every row writes its next position
at the same column, so a sentence that joins at column c has its positions 0, 1, ... at columns
c, c + 1, ...: its row is padded on the left, and the columns before c are masked out of its
self-attention. Once the sentences that joined first have left, the columns no row reads are
dropped (`reorder`), so the buffers stay as wide as the oldest sentence still decoding, and the
memories as wide as the longest source still decoding needs (`kernels.source_width`).

State tensors (B = batch rows = M sentences × beam; h = heads; S = source length):
  self_k[i]: (B, h, capacity, d_k)   self_v[i]: (B, h, capacity, d_v), length ≤ capacity ≤ max_len
  cross[i]:  ((M, h, S, d_k), (M, h, S, d_v)), or absent in a decoder-only model
  memory_mask: (M, 1, 1, S) bool, True = may attend, or None
  length: number of columns already written (the same for every row)
  start: (B,) the column each row's position 0 is at, or None when every row starts at column 0
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn import kernels


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
        if not isinstance(max_len, int) or isinstance(max_len, bool):  # a float failed inside torch.zeros
            raise TypeError(f"max_len is a number of positions, an int; got {max_len!r}")
        if max_len < 1:
            raise ValueError(f"a KV cache needs room for at least one position: max_len {max_len}")
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
        self.start: Optional[Tensor] = None  # (B,), set once a sentence joins at a later column
        self._starts = [0] * (cross[0][0].size(0) if cross else batch)  # the same per sentence, on the host
        self._sources: Optional[list[int]] = None  # source lengths per sentence, once sentences join
        self.self_mask: Optional[Tensor] = None  # (B, 1, 1, length + new) for the step under way

    @property
    def self_k(self) -> list[Tensor]:
        return self._buffers[: self.n_layers]

    @property
    def self_v(self) -> list[Tensor]:
        return self._buffers[self.n_layers :]

    def _move(self, i: int, indices: Optional[Tensor], capacity: int, drop: int = 0, new_rows: int = 0) -> None:
        """Buffer i's rows `indices` (all rows when None), the columns written so far from
        `drop` on, into the other storage with room for `capacity` columns, followed by
        `new_rows` rows of zeros (masked, but never NaN); the two storages swap roles."""
        buf, (current, spare) = self._buffers[i], self._stores[i]
        rows = (buf.size(0) if indices is None else indices.numel()) + new_rows
        need = rows * buf.size(1) * capacity * buf.size(3)
        if spare is None or spare.numel() < need or buf.requires_grad:  # a graph may hold the old one
            room = rows * buf.size(1) * self.max_len * buf.size(3)  # enough for every later step
            spare = torch.empty(room, dtype=buf.dtype, device=buf.device)
        new = spare[:need].view(rows, buf.size(1), capacity, buf.size(3))
        written, kept = buf[:, :, drop : self.length], rows - new_rows
        if indices is None or buf.requires_grad:  # out= records no gradient
            new[:kept, :, : self.length - drop] = written if indices is None else written.index_select(0, indices)
        else:
            torch.index_select(written, 0, indices, out=new[:kept, :, : self.length - drop])
        new[kept:, :, : self.length - drop] = 0
        self._buffers[i], self._stores[i] = new, [spare, current]

    def _add_rows(self, i: int, new_rows: int) -> None:
        """Buffer i followed by `new_rows` rows of zeros, in place where its storage has room
        (rows are outermost, so the rows there keep their places: nothing is copied), else by
        `_move` into the other storage."""
        buf, current = self._buffers[i], self._stores[i][0]
        rows, heads, capacity, d = buf.shape
        need = (rows + new_rows) * heads * capacity * d
        if capacity <= self.length or current.numel() < need or buf.requires_grad:
            self._move(i, None, min(self.length + 1, self.max_len), new_rows=new_rows)
            return
        grown = current[:need].view(rows + new_rows, heads, capacity, d)  # buf is current's prefix: the same rows
        grown[rows:, :, : self.length] = 0
        self._buffers[i] = grown

    def positions_end(self, new: int) -> int:
        """One past the largest position of a step of `new` positions, known on the host."""
        return self.length + new - min(self._starts, default=0)

    def positions(self, new: int):
        """Begin a step of `new` positions per row: their positions (an int when every row starts
        at column 0, else (B,) the first new position of each row), and the step's `self_mask`."""
        if self.start is None:
            self.self_mask = None
            return self.length
        columns = torch.arange(self.length + new, device=self.start.device)  # (length + new,)
        self.self_mask = (columns >= self.start[:, None])[:, None, None, :]  # (B, 1, 1, length + new)
        return self.length - self.start  # (B,)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys/values of `layer`; return all positions written so far.

        k: (B, h, t, d_k), v: (B, h, t, d_v) -> (B, h, length + t, d_k), (B, h, length + t, d_v)
        """
        end = self.length + k.size(2)
        if k.size(0) != self._buffers[layer].size(0):
            raise ValueError(f"this step has {k.size(0)} rows of tokens; the KV cache was made for {self._buffers[layer].size(0)}")
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
        same = sentences.numel() == len(self._starts)  # the same sentences (increasing indices)
        drop = 0
        if not same:  # (a read-back, on the steps where sentences leave only)
            kept = sentences.tolist()
            self._starts = [self._starts[j] for j in kept]
            if self._sources is not None:  # memories padded for a longer source that has left: cut
                self._sources = [self._sources[j] for j in kept]
                width = min(kernels.source_width(max(self._sources, default=0)), self.cross[0][0].size(2))
                self.cross = [(k[:, :, :width], v[:, :, :width]) for k, v in self.cross]
                self.memory_mask = self.memory_mask[..., :width]
            drop = min(self._starts, default=0)  # columns no sentence still decoding reads
            self._starts = [start - drop for start in self._starts]
        for i in range(len(self._buffers)):
            self._move(i, rows, min(self.length - drop + 1, self.max_len - drop), drop)
        self.length -= drop
        self.max_len -= drop
        if self.start is not None:
            self.start = None if not any(self._starts) else self.start[rows] - drop
        if same or not self.cross:
            return  # their memory rows stay as they are
        self.cross = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.cross]
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, sentences)

    def join(self, cross: list[tuple[Tensor, Tensor]], memory_mask: Optional[Tensor], rows_each: int,
             max_len: int) -> None:
        """Sentences join after those decoding (between two steps): `cross` their encoder-decoder
        keys and values per layer ((M_new, h, S_new, d) each), `memory_mask` (M_new, 1, 1, S_new)
        or None, `rows_each` rows per sentence (every sentence has as many), `max_len` the most
        positions any of them decodes. Their rows come after the others, padded to the others'
        columns; memories are padded to the longest source, the padding masked."""
        (had, _, had_len, _), (new, _, new_len, _) = self.cross[0][0].shape, cross[0][0].shape
        if self._sources is None:  # the first join: how long are the sources already here
            self._sources = [had_len] * had if self.memory_mask is None else self.memory_mask.sum(-1).flatten().tolist()
        self._sources += [new_len] * new if memory_mask is None else memory_mask.sum(-1).flatten().tolist()
        width = max(had_len, new_len)
        pad = lambda x: F.pad(x, (0, 0, 0, width - x.size(2)))  # noqa: E731  (M, h, S, d) -> (M, h, width, d)
        self.cross = [(torch.cat([pad(k), pad(nk.to(k.dtype))]), torch.cat([pad(v), pad(nv.to(v.dtype))]))
                      for (k, v), (nk, nv) in zip(self.cross, cross)]

        def padded(mask: Optional[Tensor], sentences: int, length: int) -> Tensor:  # -> (sentences, 1, 1, width)
            if mask is None:  # no padding: every source position may be attended
                mask = torch.ones(sentences, 1, 1, length, dtype=torch.bool, device=self.cross[0][0].device)
            return F.pad(mask, (0, width - length))

        self.memory_mask = torch.cat([padded(self.memory_mask, had, had_len), padded(memory_mask, new, new_len)])
        self.max_len = max(self.max_len, self.length + max_len)
        for i in range(len(self._buffers)):
            self._add_rows(i, new * rows_each)
        rows = self._buffers[0].size(0)
        old = self.start if self.start is not None else torch.zeros(rows - new * rows_each, dtype=torch.long,
                                                                    device=self._buffers[0].device)
        self.start = torch.cat([old, old.new_full((new * rows_each,), self.length)])  # (B,)
        self._starts += [self.length] * new
