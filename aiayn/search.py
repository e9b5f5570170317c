"""Decoding (§6.1): pure functions over a step function, decoupled from the model.

A search talks to the model through two calls:
  step(tokens)      tokens: (B,) the last token of each live row -> log-probabilities (B, V)
                    of the next token; the step function keeps its own KV cache.
  reorder(indices)  indices: (B',) keep these rows, in this order (rows leave when finished).
`ModelStep` adapts a `Transformer` to this interface.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from aiayn.model import Transformer

StepFn = Callable[[Tensor], Tensor]
ReorderFn = Callable[[Tensor], None]


class ModelStep:
    """Encodes the source once and steps the decoder with a KV cache.

    State: memory (B, S, d_model), cache (see aiayn.cache), both reordered together.
    """

    def __init__(self, model: Transformer, src: Tensor, max_len: int) -> None:
        self.model = model
        self.memory, mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        self.cache = model.init_cache(self.memory, mask, max_len)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        tokens = tokens.to(self.memory.device).unsqueeze(1)  # (B, 1)
        logits = self.model.decode(tokens, self.memory, cache=self.cache)  # (B, 1, V)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B, V)

    def reorder(self, indices: Tensor) -> None:
        indices = indices.to(self.memory.device)
        self.memory = self.memory.index_select(0, indices)
        self.cache.reorder(indices)


def greedy(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor
) -> list[list[int]]:
    """Pick the most probable token at each step until EOS or `max_len` (B,) tokens.

    Finished sentences leave the batch, so late steps cost only the rows still decoding.
    Returns, per sentence, the tokens without BOS and EOS.
    """
    batch = max_len.numel()
    outputs: list[list[int]] = [[] for _ in range(batch)]
    alive = torch.arange(batch)  # sentence index of each live row
    tokens = torch.full((batch,), bos_id, dtype=torch.long)
    limit = max_len.clone()
    for length in range(int(max_len.max())):
        best = step(tokens).argmax(dim=-1).cpu()  # (B_live,)
        done = (best == eos_id) | (limit <= length + 1)
        for row, sentence in enumerate(alive.tolist()):
            if best[row] != eos_id:
                outputs[sentence].append(int(best[row]))
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (B_live',)
            reorder(keep)
            alive, best, limit = alive[keep], best[keep], limit[keep]
        tokens = best
    return outputs
