"""Batches built to a token budget (§5.1), from encoded sentence pairs.

§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens." `make_batches` sorts pairs by length and cuts batches so that the padded source and the
padded target each hold at most `max_tokens` tokens; `BatchStream` serves them epoch after epoch
from a state of two integers, so training resumes exactly where it stopped. The pairs are
`EncodedPairs`: ids in memory or memory-mapped from a preprocessed corpus (aiayn.store).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from aiayn.config import check_whole

EncodedPair = tuple[list[int], list[int]]


class EncodedPairs:
    """Token ids of sentence pairs: one flat id array, where pair i starts (`offsets`) and the
    (source, target) lengths of each pair (`lengths`, (N, 2), no BOS/EOS). The arrays are in
    memory (`from_lists`) or memory-mapped from a DATA_DIR (`Store.split`). `pairs[i]` is
    (source ids, target ids). `rows` selects a subset of another set's pairs without copying ids.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                 rows: Optional[np.ndarray] = None) -> None:
        self.ids, self.offsets = ids, offsets  # (total ids,), (pairs in the file + 1,)
        self.lengths = lengths  # (N, 2): of the pairs in this set
        self.rows = rows  # (N,): where this set's pairs are in the file; None: all, in order

    @classmethod
    def from_lists(cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> "EncodedPairs":
        lengths = np.array([(len(s), len(t)) for s, t in pairs], dtype=np.int32).reshape(-1, 2)  # (N, 2)
        offsets = np.zeros(len(pairs) + 1, dtype=np.int64)  # (N + 1,)
        np.cumsum(lengths.sum(axis=1), out=offsets[1:])
        ids = np.fromiter((i for s, t in pairs for i in (*s, *t)), dtype=np.int64, count=int(offsets[-1]))
        return cls(ids, offsets, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        # Checked only where numpy would not refuse: a batch reads every pair through here.
        if i < 0:  # from the end, as a list counts (numpy would read the offsets of another row)
            if i < -len(self):
                raise IndexError(f"pair {i} of {len(self):,}")
            i += len(self)
        try:
            source_len = int(self.lengths[i, 0])
        except IndexError:  # past the end: numpy's message names an index of its own arrays
            raise IndexError(f"pair {i} of {len(self):,}") from None
        row = int(i if self.rows is None else self.rows[i])
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return self.ids[start:start + source_len], self.ids[start + source_len:end]

    def subset(self, rows: np.ndarray) -> "EncodedPairs":
        """The pairs `rows` (indices into this set), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        in_file = rows if self.rows is None else self.rows[rows]
        return EncodedPairs(self.ids, self.offsets, np.asarray(self.lengths[rows]), in_file)


def as_encoded(pairs) -> EncodedPairs:
    """`pairs` as `EncodedPairs`: a list of (source ids, target ids) is packed into arrays."""
    return pairs if isinstance(pairs, EncodedPairs) else EncodedPairs.from_lists(list(pairs))


def within_length(lengths: np.ndarray, max_sentence_tokens: int) -> np.ndarray:
    """Indices of the pairs, of (N, 2) source and target `lengths` (no BOS/EOS), whose
    source + EOS and BOS + target both fit in `max_sentence_tokens`."""
    return np.flatnonzero((lengths.max(axis=1) + 1) <= max_sentence_tokens)



@dataclass
class Batch:
    """A padded batch. `tgt_in` is the decoder input, shifted right by one (BOS first); `tgt_out`
    is what each decoder position predicts (EOS last). Both are (B, T); padding is pad_id."""

    src: Tensor  # (B, S) source ids + EOS
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: int  # non-pad tokens in tgt_out: the loss is a mean over these

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "Batch":
        src, tgt_in, tgt_out = (to_device(t, device, non_blocking) for t in (self.src, self.tgt_in, self.tgt_out))
        return Batch(src, tgt_in, tgt_out, self.n_src_tokens, self.n_tgt_tokens)


def to_device(tensor: Tensor, device: Union[str, torch.device], non_blocking: bool = False) -> Tensor:
    """`tensor.to(device)`; `non_blocking` from the host to a GPU through pinned memory, where the
    copy is queued and the host goes on. From pageable memory the driver stages the copy first,
    and the host may wait there (CUDA promises no more)."""
    if non_blocking and tensor.device.type == "cpu" and torch.device(device).type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=non_blocking)


def make_batches(lengths, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Indices of the pairs in each batch of one epoch.

    `lengths[i]` is (source length, target length) of pair i as it will be in the tensors (with
    EOS / BOS, so at least 1). Pairs are sorted by the longer of their two lengths, then by source
    and target length (ties in a random order drawn from seed and epoch), and cut greedily so
    that batch size x longest source <= max_tokens and batch size x longest target <=
    max_tokens: a budget on padded tokens, as fairseq's --max-tokens. A pair
    longer than max_tokens on its own forms a batch of one. The order of the batches is then
    shuffled. The same (seed, epoch) always gives the same batches.

    Computed per run of equal lengths rather than per pair, so that WMT14's 4.5M pairs are cut
    in a fraction of a second, into views of one index array instead of ~9M Python integers.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
    rng = np.random.default_rng([seed, epoch])
    table = np.asarray(lengths).reshape(-1, 2)  # (N, 2), int32 from a DATA_DIR: no int64 copy of it
    if len(table) and table.min() < 1:
        raise ValueError("pair lengths count EOS / BOS and must be at least 1")
    shuffled = rng.permutation(len(table))  # (N,)
    # By the longer side, then source length, then target length, ties in the shuffled order (a
    # stable sort). The budget is on the longer side (batch size x longest), so pairs whose longer
    # sides are equal fill a batch with no padding on that side, whichever side it is; tensor2tensor
    # (the paper's code) buckets by the longer side as well. One key rather than lexsort's three,
    # and int32 where it fits, so that few N-long arrays are alive at once: this index is what a
    # process's memory grows by with the corpus.
    src_width, tgt_width = (int(table[:, side].max(initial=0)) + 1 for side in (0, 1))
    small = max(src_width, tgt_width) * src_width * tgt_width < 2**31
    kind = np.int32 if small else np.int64
    src, tgt = table[shuffled, 0].astype(kind), table[shuffled, 1].astype(kind)  # (N,)
    key = np.maximum(src, tgt)  # (N,), then (longer, source, target) in one integer, in place
    key *= src_width
    key += src
    key *= tgt_width
    key += tgt
    del src, tgt
    order = shuffled[np.argsort(key, kind="stable")]  # (N,)
    del key, shuffled
    if len(order) < 2**31:
        order = order.astype(np.int32)  # kept for the epoch: half the bytes
    src, tgt = table[order, 0], table[order, 1]  # (N,)
    # Equal (source, target) lengths lie side by side: a run of them is cut with arithmetic, so
    # the loop runs once per run and per batch, never per pair.
    change = np.flatnonzero((src[1:] != src[:-1]) | (tgt[1:] != tgt[:-1])) + 1  # (runs - 1,)
    run_starts = np.concatenate([[0], change]).tolist() if len(order) else []
    run_ends = [*run_starts[1:], len(order)]
    longest_of_run = np.maximum(src, tgt)[run_starts].tolist()
    cuts: list[int] = []  # where each batch but the first starts, in `order`
    count = longest = 0  # the open batch: its pairs and its longest side
    for start, end, length in zip(run_starts, run_ends, longest_of_run):
        while start < end:
            grown = max(longest, length)
            room = max(max_tokens // grown, 1)  # pairs a batch this long may hold; the first always goes in
            if room <= count:  # the next pair does not fit: it opens a new batch
                cuts.append(start)
                count = longest = 0
                continue
            taken = min(end - start, room - count)
            count, longest, start = count + taken, grown, start + taken
    batches = np.split(order, cuts) if len(order) else []
    return [batches[i] for i in rng.permutation(len(batches)).tolist()]


def collate(encoded_pairs: Sequence[EncodedPair], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Right-padded tensors of source + EOS, BOS + target and target + EOS. The ids of a pair may
    be lists or numpy arrays (a memory-mapped corpus, aiayn.store)."""
    src_lengths = [len(s) for s, _ in encoded_pairs]
    tgt_lengths = [len(t) for _, t in encoded_pairs]
    rows, src_len, tgt_len = len(encoded_pairs), max(src_lengths) + 1, max(tgt_lengths) + 1
    src = np.full((rows, src_len), pad_id, dtype=np.int64)  # (B, S)
    tgt_in = np.full((rows, tgt_len), pad_id, dtype=np.int64)  # (B, T)
    tgt_out = np.full((rows, tgt_len), pad_id, dtype=np.int64)  # (B, T)
    for row, ((s, t), n, m) in enumerate(zip(encoded_pairs, src_lengths, tgt_lengths)):
        src[row, :n], src[row, n] = s, eos_id
        tgt_in[row, 0], tgt_in[row, 1:m + 1] = bos_id, t
        tgt_out[row, :m], tgt_out[row, m] = t, eos_id
    n_src, n_tgt = sum(src_lengths) + rows, sum(tgt_lengths) + rows
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), n_src, n_tgt)


class BatchStream:
    """Endless batches over `encoded_pairs` (a list of (source ids, target ids), or
    `EncodedPairs`, whose ids are read only when a batch of this rank needs them), epoch after
    epoch, resumable from `state_dict()`: {"epoch", "index"}, the position in the epoch's batch
    list, which `make_batches` rebuilds from (seed, epoch).

    With `shard=(rank, world_size)` each rank takes every world_size-th batch of the same list.
    The list is first extended by wrapping around to a multiple of world_size, so every rank has
    as many batches per epoch and all ranks share one state (rank 0's checkpoint serves all).
    """

    def __init__(
        self,
        encoded_pairs,
        max_tokens: int,
        seed: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        rank, world_size = shard
        if not 0 <= rank < world_size:
            raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, got {shard}")
        check_whole(max_tokens=max_tokens, seed=seed)
        if callable(getattr(encoded_pairs, "split", None)):  # a Store (found in review: "'Store' object is not iterable")
            raise TypeError("BatchStream takes a split's pairs (store.split('train')), not the store")
        if not encoded_pairs:
            raise ValueError("cannot batch an empty list of sentence pairs")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
        self.pairs = as_encoded(encoded_pairs)  # a list of pairs, or EncodedPairs (memory-mapped)
        self.max_tokens, self.seed = max_tokens, seed
        self.special = (pad_id, bos_id, eos_id)
        self.rank, self.world_size = rank, world_size
        self.epoch, self.index = 0, 0
        self._cached: tuple[int, list[np.ndarray]] = (-1, [])

    def epoch_batches(self) -> list[np.ndarray]:
        """This rank's batches (lists of pair indices) of the current epoch."""
        if self._cached[0] != self.epoch:
            # Lengths as in the tensors, with EOS / BOS; made per epoch, not kept (N × 8 bytes).
            batches = make_batches(self.pairs.lengths + 1, self.max_tokens, self.seed, self.epoch)
            total = -(-len(batches) // self.world_size) * self.world_size  # rounded up to a multiple
            wrapped = [batches[i % len(batches)] for i in range(total)]
            self._cached = (self.epoch, wrapped[self.rank :: self.world_size])
        return self._cached[1]

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.index >= len(self.epoch_batches()):
            self.epoch, self.index = self.epoch + 1, 0
        indices = self.epoch_batches()[self.index]
        self.index += 1
        return collate([self.pairs[i] for i in indices], *self.special)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "world_size": self.world_size, "pairs": len(self.pairs)}

    def load_state_dict(self, state: dict) -> Optional[str]:
        """Go on from `state`; returns a note where it cannot be exactly where it was, else None.
        Saved by a run of another number of ranks, the position is carried over in the epoch's
        whole batch list, where all ranks stood together (found in review: a rank's index was
        taken as is, so 8 ranks resumed as 4 trained a stretch of batches twice, and 4 as 8
        skipped one). Saved over another number of pairs (data made anew), the epoch's batches
        are others: said (found in review: silent). A state from before these were recorded is
        taken as this run's."""
        if not {"epoch", "index"} <= set(state) <= {"epoch", "index", "world_size", "pairs"}:
            raise ValueError(f"a BatchStream state has the keys epoch and index (and world_size, pairs), got {sorted(state)}")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        notes = []
        if (pairs := int(state.get("pairs", len(self.pairs)))) != len(self.pairs):
            notes.append(f"the training data has {len(self.pairs):,} pairs, not the {pairs:,} the run was trained on: "
                         "the rest of this epoch is batched anew, so some pairs may be seen twice and others not at all")
        if (world := int(state.get("world_size", self.world_size))) != self.world_size:
            done = self.index * world  # batches of the epoch's list the ranks had taken together
            self.index = done // self.world_size
            again = done - self.index * self.world_size
            notes.append(f"the run had {world} processes and has {self.world_size}: the epoch goes on from its batch "
                         f"{done:,}" + (f" ({again} batches are seen again)" if again else ""))
        return "; ".join(notes) or None


def check_tokens(name: str, tokens: Tensor, vocab_size: int, check_range: bool = True) -> None:
    """A one-line error for `tokens` that are no (batch, length) LongTensor of ids in [0,
    vocab_size). `check_range` false skips the ids' range, which reads values back: a sync on a
    GPU, where a training step checks its batches on the host instead (aiayn.train.TrainStep)."""
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        dtype = tokens.dtype if isinstance(tokens, Tensor) else ""
        raise ValueError(f"{name} must be a LongTensor of shape (batch, length), got {dtype} {shape}")
    if tokens.size(1) == 0:
        raise ValueError(f"{name} is empty: every sequence needs at least one token")
    if tokens.size(0) == 0:  # (an attention over no rows divided by zero)
        raise ValueError(f"{name} is a batch of no sequences: give at least one")
    if _outside(tokens, vocab_size, check_range):
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab_size})")


def _outside(indices: Tensor, count: int, check_range: bool) -> bool:
    """Whether `indices` hold one outside [0, count): read back, so only where `check_range` and
    not in a compiled step (whose batches are our own)."""
    check_range = check_range and not torch.compiler.is_compiling()
    return check_range and bool(indices.numel()) and (int(indices.min()) < 0 or int(indices.max()) >= count)



def check_positions(positions: Tensor, count: int, check_range: bool = True) -> None:
    """A one-line error for target `positions` that are no (N,) LongTensor of indices into the
    `count` = B·T positions of a batch, row by row (`Transformer.decode`); `check_range` as in
    `check_tokens`."""
    if not isinstance(positions, Tensor) or positions.dtype != torch.long or positions.dim() != 1:
        got = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a LongTensor (N,) of flat indices into the batch × length targets, got {got}")
    if _outside(positions, count, check_range):
        raise ValueError(f"positions holds indices outside the {count} target positions (batch × length)")


__all__ = ["EncodedPairs", "as_encoded", "within_length", "Batch", "make_batches", "collate", "BatchStream", "check_tokens", "check_positions"]
