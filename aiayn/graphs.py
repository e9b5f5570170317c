"""Decoding on a GPU with each step one CUDA graph (`DecodeConfig.cuda_graphs`).

A decoding step of the Transformer (§3.1, one new position per row) is a few hundred small
kernels. On a GPU the host takes longer to launch them than the GPU takes to run them: an H100
took about 4.5 ms for a beam-4 step of 256 rows of the base model, where CTranslate2 took a
quarter to a third of that (benchmarks/results/speed-decode-cuda-h100.json). A CUDA graph records the step's
kernels once and launches them all at once on every later step: on an H100 (2026-11-27, base,
one batch of 64 sentences of one length), beam 4 at 2.9× and greedy at 4.9× the tokens/s of the
same search without it, above CTranslate2's in the same run (greedy: beside its int8 only;
benchmarks/results/speed-decode-cuda-h100-b69fbca.json).

A graph replays fixed shapes at fixed addresses, which the decoding state of aiayn.cache does
not keep (its buffers grow with the output and shrink as sentences leave). `StaticCache` keeps
what `Decoder.forward` asks of a cache in fixed shapes instead:
- every row keeps its place, its slot, for the whole search: the beams of sentence m are slots
  m·k .. m·k + k - 1. The search's live rows are some of the slots (`GraphedStep.slots`); the
  others are computed too, and never read;
- the self-attention buffers hold all max_len positions from the start: a step writes column t
  and attends to every column, those after t masked (their weight is exactly 0);
- t is a tensor on the device, which the step itself advances.
A step's result then differs from aiayn.translate.ModelStep's by the order of its sums only.

The graph is recorded for a batch's shape (its sentences, beam, source width and max_len),
after `WARMUP` steps run without it, as PyTorch's notes on CUDA graphs ask (libraries set up
their workspaces, the allocator its blocks, outside the recording), and the next batches of that
shape replay it. Without a GPU, or under `reference_math()`, the same
static step runs without a graph (the tests compare it with ModelStep on the CPU).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from aiayn import kernels
from aiayn.model import Transformer

WARMUP = 2  # steps run before the graph is recorded


class StaticCache:
    """The decoding state of one batch in fixed shapes, with the interface of aiayn.cache.KVCache
    that `Decoder.forward` uses. State (R = M sentences × k beams, h heads, L = max_len):
      keys (N, R, h, L, d_k), values (N, R, h, L, d_v): every layer's self-attention buffers
      cross[i]: ((M, h, S, d_k), (M, h, S, d_v)), memory_mask (M, 1, 1, S): the source's, as KVCache's
      t (1,): the column the next step writes, on the device"""

    def __init__(self, n_layers: int, rows: int, n_heads: int, d_k: int, d_v: int, max_len: int, dtype: torch.dtype,
                 device: torch.device, cross: list[tuple[Tensor, Tensor]], memory_mask: Optional[Tensor]) -> None:
        self.rows, self.max_len = rows, max_len
        self.keys = torch.zeros(n_layers, rows, n_heads, max_len, d_k, dtype=dtype, device=device)
        self.values = torch.zeros(n_layers, rows, n_heads, max_len, d_v, dtype=dtype, device=device)
        self.cross = [(k.to(dtype).contiguous(), v.to(dtype).contiguous()) for k, v in cross]
        self.memory_mask = memory_mask
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.columns = torch.arange(max_len, device=device)  # (L,)
        self.self_mask: Optional[Tensor] = None

    def positions(self, new: int) -> Tensor:
        """Begin a step of one position per row: its position t for every row (R,), and the
        step's `self_mask`, the columns written so far and this step's."""
        if new != 1:
            raise ValueError(f"a static decoding state takes one position a step, not {new}")
        self.self_mask = (self.columns <= self.t)[None, None, None, :]  # (1, 1, 1, L)
        return self.t.expand(self.rows)

    def positions_end(self, new: int) -> int:
        """One past the largest position any step reaches, known on the host."""
        return self.max_len

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's keys (R, h, 1, d_k) and values (R, h, 1, d_v) of `layer` at column t;
        return the layer's whole buffers (R, h, L, d_k), (R, h, L, d_v)."""
        self.keys[layer].index_copy_(2, self.t, k.to(self.keys.dtype))  # an int8 model's fp32 into a bf16 cache
        self.values[layer].index_copy_(2, self.t, v.to(self.values.dtype))
        return self.keys[layer], self.values[layer]

    def advance(self, steps: int) -> None:
        self.t += steps

    def refill(self, cross: list[tuple[Tensor, Tensor]], memory_mask: Tensor) -> None:
        """Another batch of the same shape: its source's keys, values and mask in place of these,
        from column 0 again. The columns written before are zeroed: masked, a column's weight is
        0, but 0 × an inf left by an overflow would still be NaN."""
        for (k, v), (new_k, new_v) in zip(self.cross, cross):
            k.copy_(new_k)
            v.copy_(new_v)
        self.memory_mask.copy_(memory_mask)
        self.keys.zero_()
        self.values.zero_()
        self.t.zero_()

    def move(self, parents: Tensor, slots: Optional[Tensor], written: int) -> None:
        """Slots `slots` (B',) continue the rows of slots `parents` (B',), every slot in order
        where `slots` is None: their first `written` columns, every layer at once. The columns
        after them are masked until a step writes them, so a beam search's reorder moves what it
        has written, as KVCache's does, not max_len."""
        for buffers in (self.keys, self.values):
            moved = buffers[:, parents, :, :written]  # a copy: every parent is read before any slot is written
            if slots is None:
                buffers[:, :, :, :written] = moved
            else:
                buffers[:, slots, :, :written] = moved


@dataclass
class _Recording:
    """What the steps of a batch run or replay: its fixed-shape state, the step's input and
    output, and the graph (recorded at the `WARMUP`-th step, on `stream`)."""

    key: tuple  # (sentences, beam, source width, max_len, on a graph, where the weights are)
    cache: StaticCache
    tokens: Tensor  # (R,) each slot's newest token
    stream: Optional[torch.cuda.Stream]
    graph: Optional[torch.cuda.CUDAGraph] = None
    log_probs: Optional[Tensor] = None  # (R, V)
    steps: int = 0


# The last recording of each decoding model: a batch of the same shape replays its graph, its
# new source's keys and values copied in, rather than recording another (a benchmark's calls, a
# file's batches of equal sentences). One batch at a time: a second search of the same shape on
# the same model while one runs would share its state. Weak keys: it goes with its model.
_LAST: "weakref.WeakKeyDictionary[Transformer, _Recording]" = weakref.WeakKeyDictionary()


class GraphedStep:
    """The step function of aiayn.search (as aiayn.translate.ModelStep) over a `StaticCache`, for
    a search of `beam` beams over the sentences `src` (M, S); on a GPU (and `graph`) every step
    from the `WARMUP`-th on is one replay of a CUDA graph. Sentences cannot join it (continuous
    batching keeps ModelStep), and restricted self-attention (Table 1's r) has none: its band is
    placed around the newest column, where a static step's query is at column t (`fits`)."""

    def __init__(self, model: Transformer, src: Tensor, max_len: int, beam: int = 1, graph: bool = True) -> None:
        if not self.fits(model.config):
            raise ValueError("a static decoding step takes full self-attention, not restricted (neighborhood)")
        self.model, self.beam = model, beam
        memory, mask = model.encode(src)  # (M, S, d_model), (M, 1, 1, S)
        config, sentences = model.config, src.size(0)
        cross = model.memory_keys_values(memory)
        graphed = graph and src.is_cuda and not kernels.use_reference()
        # The graph reads the weights and the positions' table where they were when it was
        # recorded: a table regrown, or weights moved, since then make another recording.
        table = model.decoder.positions.table  # sinusoids, or Table 3 row E's learned embedding
        where = ((table.weight if isinstance(table, torch.nn.Module) else table).data_ptr(),
                 model.decoder.embed.weight.data_ptr(), model.decoder.embed.weight.dtype)
        key = (sentences, beam, src.size(1), max_len, graphed, where)
        self.run = _LAST.get(model)
        if self.run is not None and self.run.key == key:
            self.run.cache.refill(cross, mask)
        else:
            d_k, d_v = config.head_dims
            cache = StaticCache(config.n_layers, sentences * beam, config.n_heads, d_k, d_v, max_len,
                                kernels.cache_dtype(model, memory, beam), memory.device, cross, mask)
            tokens = torch.full((sentences * beam,), config.bos_id, dtype=torch.long, device=src.device)  # (R,)
            self.run = _LAST[model] = _Recording(key, cache, tokens, torch.cuda.Stream(src.device) if graphed else None)
        self.live = torch.arange(sentences, device=src.device)  # (M',) the live sentences among the M
        self.slots = self.live * beam  # (B',) the live rows' slots: one row a sentence before the first step
        self.written = 0  # the columns this search has written: its steps so far

    @property
    def dense(self) -> bool:
        """Whether the live rows are every slot, in order (all sentences, all beams, as long as no
        sentence has left): a step then reads and writes the state whole, with no index."""
        return self.slots.numel() == self.run.cache.rows

    @staticmethod
    def fits(config) -> bool:
        """Whether a model decodes with this step: not with restricted self-attention."""
        return config.neighborhood is None

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """tokens: (B',) of the live rows -> their log-probabilities of the next token (B', V)."""
        run = self.run
        if self.dense:
            if tokens.numel() != run.tokens.numel():
                raise ValueError(f"{tokens.numel()} tokens for the {run.tokens.numel()} rows of every slot")
            run.tokens.copy_(tokens)
        else:
            run.tokens[self.slots] = tokens
        if run.graph is not None:
            run.graph.replay()
        elif run.stream is None:
            run.log_probs = self.model.next_log_probs(run.tokens, run.cache)  # (R, V)
        elif run.steps < WARMUP:  # on the stream the graph is recorded on, as CUDA's examples do
            run.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(run.stream):
                run.log_probs = self.model.next_log_probs(run.tokens, run.cache)  # (R, V)
            torch.cuda.current_stream().wait_stream(run.stream)
        else:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=run.stream):  # recorded, not run
                    run.log_probs = self.model.next_log_probs(run.tokens, run.cache)  # (R, V)
            except BaseException:
                _LAST.pop(self.model, None)  # no later batch may replay a recording that failed
                raise
            run.graph = graph
            run.graph.replay()
        run.steps += 1
        self.written += 1
        return run.log_probs if self.dense else run.log_probs[self.slots]  # the graph's output, read before its next replay

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        """As KVCache.reorder: continue with the live rows `rows` (M'·beam,), the beams of the
        live sentences `sentences` (M',); each moves into its sentence's slots."""
        if rows.numel() != sentences.numel() * beam:
            raise ValueError(f"{rows.numel()} rows are not {sentences.numel()} sentences × beam {beam}")
        parents = rows if self.dense else self.slots[rows]  # (M'·beam,)
        if sentences.numel() != self.live.numel() or not self.dense:  # else every slot stays live, in order
            self.live = self.live[sentences]  # (M',)
            self.slots = (self.live[:, None] * self.beam + torch.arange(beam, device=rows.device)).flatten()  # (M'·beam,)
        self.run.cache.move(parents, None if self.dense else self.slots, self.written)
