"""Decoding (§6.1): pure functions over a step function, decoupled from the model.

A search talks to the model through two calls:
  step(tokens)      tokens: (B,) the last token of each live row -> log-probabilities (B, V)
                    of the next token; the step function keeps its own KV cache.
  reorder(indices)  indices: (B',) keep these rows, in this order (rows leave when finished).
`ModelStep` adapts a `Transformer` to this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from aiayn.model import Transformer

StepFn = Callable[[Tensor], Tensor]
ReorderFn = Callable[[Tensor], None]


class ModelStep:
    """Encodes the source once and steps the decoder with a KV cache.

    State: the cache (see aiayn.cache); the memory (B, S, d_model) until the first step has put
    its keys and values there.
    """

    def __init__(self, model: Transformer, src: Tensor, max_len: int) -> None:
        self.model = model
        self.device = src.device
        self.memory, mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        self.cache = model.init_cache(self.memory, mask, max_len)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        tokens = tokens.to(self.device).unsqueeze(1)  # (B, 1)
        logits = self.model.decode(tokens, self.memory, cache=self.cache)  # (B, 1, V)
        self.memory = None  # the first step put its keys and values in the cache
        return torch.log_softmax(logits[:, -1], dim=-1, dtype=torch.float32)  # (B, V)

    def reorder(self, indices: Tensor) -> None:
        self.cache.reorder(indices.to(self.device))


def greedy(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, min_len: int = 0
) -> list[list[int]]:
    """Pick the most probable token at each step until EOS or `max_len` (B,) tokens; EOS is
    barred before `min_len` tokens (fairseq's --min-len, HF's min_new_tokens).

    Finished sentences leave the batch, so late steps cost only the rows still decoding.
    Returns, per sentence, the tokens without BOS and EOS.
    """
    batch = max_len.numel()
    outputs: list[list[int]] = [[] for _ in range(batch)]
    alive = torch.arange(batch)  # sentence index of each live row
    tokens = torch.full((batch,), bos_id, dtype=torch.long)
    limit = max_len.clone()
    for length in range(int(max_len.max())):
        log_probs = step(tokens)  # (B_live, V)
        if length < min_len:
            log_probs[:, eos_id] = float("-inf")
        best = log_probs.argmax(dim=-1).cpu()  # (B_live,)
        done = (best == eos_id) | (limit <= length + 1)
        for sentence, token in zip(alive.tolist(), best.tolist()):
            if token != eos_id:
                outputs[sentence].append(token)
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (B_live',)
            reorder(keep)
            alive, best, limit = alive[keep], best[keep], limit[keep]
        tokens = best
    return outputs


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), the one §6.1 uses with α = 0.6.
    (fairseq's |Y|^α is a different penalty.) |Y| counts the output tokens and the EOS."""
    return ((5 + length) / 6) ** alpha


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    log_prob: float  # log P(tokens, EOS | source)
    score: float  # log_prob / length_penalty


def beam_search(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, beam: int = 4, alpha: float = 0.6,
    min_len: int = 0,
) -> list[Hypothesis]:
    """Beam search with the paper's settings as defaults (§6.1: beam 4, α = 0.6, the caller
    sets max_len = source length + 50). Returns the best finished hypothesis of each sentence.

    The rows are the live beams of the live sentences, flattened sentence-major: row b·k + j is
    beam j of live sentence b. State (B = live sentences, k = beams, t = tokens so far):
      scores (B, k) cumulative log-probabilities; history (B, k, t) tokens; limit (B,) max_len;
      alive (B,) the sentence each live row-group belongs to; finished: per sentence, a list.
    At step 0 only one beam per sentence exists (all beams would be equal), so the search starts
    with B rows and widens to B·k after the first step. Each step takes the top 2k candidates so
    that k of them continue even if up to k end in EOS; an EOS among the top k finishes a
    hypothesis. A sentence leaves the batch once it has k finished hypotheses (every beam has
    finished) or reaches max_len, where only EOS is allowed. Before `min_len` tokens EOS is barred.
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    batch = max_len.numel()
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    alive = torch.arange(batch)
    limit = max_len.clone()
    scores = torch.zeros(batch, 1)
    history = torch.empty(batch, 1, 0, dtype=torch.long)
    tokens = torch.full((batch,), bos_id, dtype=torch.long)
    t = 0
    while alive.numel():
        live, width = scores.shape
        log_probs = step(tokens).float().cpu().view(live, width, -1)  # (B, k_cur, V)
        vocab = log_probs.size(-1)
        at_limit = limit <= t  # (B,)
        if t < min_len:
            log_probs[~at_limit, :, eos_id] = float("-inf")
        if at_limit.any():
            eos_only = torch.full_like(log_probs[at_limit], float("-inf"))
            eos_only[..., eos_id] = log_probs[at_limit][..., eos_id]
            log_probs[at_limit] = eos_only
        candidates = (scores.unsqueeze(-1) + log_probs).view(live, width * vocab)  # (B, k_cur·V)
        top_scores, top = candidates.topk(min(2 * beam, width * vocab), dim=1)  # (B, 2k)
        parent, token = top // vocab, top % vocab  # (B, 2k)
        is_eos = token == eos_id
        for b, sentence in enumerate(alive.tolist()):
            for j in is_eos[b, :beam].nonzero().flatten().tolist():
                if len(finished[sentence]) < beam and top_scores[b, j] > float("-inf"):
                    log_prob = float(top_scores[b, j])
                    finished[sentence].append(
                        Hypothesis(history[b, parent[b, j]].tolist(), log_prob, log_prob / length_penalty(t + 1, alpha))
                    )
        # The k best candidates that do not end in EOS continue (stable sort keeps the ranking).
        pick = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :beam]  # (B, k)
        scores, parent, token = top_scores.gather(1, pick), parent.gather(1, pick), token.gather(1, pick)
        done = at_limit | torch.tensor([len(finished[s]) >= beam for s in alive.tolist()])
        keep = (~done).nonzero().flatten()  # (B',)
        rows = (keep.unsqueeze(1) * width + parent[keep]).flatten()  # (B'·k,) rows of the parents
        if keep.numel():
            reorder(rows)
        history = torch.cat([history[keep.unsqueeze(1), parent[keep]], token[keep].unsqueeze(-1)], dim=-1)
        scores, tokens, alive, limit = scores[keep], token[keep].flatten(), alive[keep], limit[keep]
        t += 1
    return [max(hyps, key=lambda h: h.score) for hyps in finished]
