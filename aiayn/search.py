"""Decoding (§6.1): beam search and greedy search over a step function, decoupled from the model.

A search talks to the model through two calls (aiayn.translate.ModelStep adapts a Transformer):
  step(tokens)                        tokens: (B,) the last token of each live row ->
                                      log-probabilities (B, V) of the next token
  reorder(rows, sentences, beam)      continue with rows `rows` (M'·beam,), sentence-major: the
                                      beams of the sentences `sentences` (M',) among those live
The search state stays on the device of `max_len`: no step copies scores to the host or loops
over sentences in Python. Each step reads one number back, how many sentences are done, which
decides whether the batch shrinks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from aiayn.config import DECODE_PRESETS

StepFn = Callable[[Tensor], Tensor]
ReorderFn = Callable[[Tensor, Tensor, int], None]


SECTION_6_1 = DECODE_PRESETS["translate"]  # beam 4, α 0.6


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), the one §6.1 uses with α = 0.6.
    (fairseq's |Y|^α is a different penalty.) |Y| counts the output tokens and the EOS."""
    return ((5 + length) / 6) ** alpha


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    log_prob: float  # log P(tokens, EOS | source)
    score: float  # log_prob / length_penalty
    # With n_best > 1: the sentence's next best finished hypotheses, best first (LibreTranslate's
    # "alternatives"); empty otherwise.
    alternatives: list["Hypothesis"] = field(default_factory=list)


class _Finished:
    """The finished hypotheses of every sentence, on the device (N sentences, k = beam, L = the
    longest output): tokens (N, k + 1, L), lengths (N, k + 1), log_probs (N, k + 1), count (N,).
    Slot k takes the hypotheses beyond a sentence's k-th, which are never read."""

    def __init__(self, sentences: int, beam: int, longest: int, device: torch.device) -> None:
        self.beam = beam
        self.tokens = torch.zeros(sentences, beam + 1, max(longest, 1), dtype=torch.long, device=device)
        self.lengths = torch.zeros(sentences, beam + 1, dtype=torch.long, device=device)
        self.log_probs = torch.full((sentences, beam + 1), float("-inf"), device=device)
        self.count = torch.zeros(sentences, dtype=torch.long, device=device)

    def add(self, alive: Tensor, ends: Tensor, log_probs: Tensor, tokens: Tensor) -> None:
        """Sentences `alive` (B,) finish the hypotheses where `ends` (B, j) is set, with their
        log-probabilities (B, j) and output tokens (B, j, t), in rank order."""
        slot = self.count[alive].unsqueeze(1) + ends.cumsum(1) - 1  # (B, j)
        slot = torch.where(ends & (slot < self.beam), slot, self.beam)
        sentence = alive.unsqueeze(1).expand_as(slot)  # (B, j)
        self.tokens[sentence, slot, : tokens.size(-1)] = tokens
        self.lengths[sentence, slot] = tokens.size(-1)
        self.log_probs[sentence, slot] = log_probs
        self.count[alive] = (self.count[alive] + ends.sum(1)).clamp(max=self.beam)

    def best(self, alpha: float, n_best: int = 1) -> list[Hypothesis]:
        """The finished hypothesis with the best score of each sentence (the first on a tie),
        with the next `n_best` - 1 of it, by score, as its `alternatives`."""
        log_probs, lengths = self.log_probs[:, : self.beam], self.lengths[:, : self.beam]  # (N, k)
        scores = log_probs / ((5 + lengths + 1) / 6) ** alpha  # length_penalty, the EOS counted
        # A stable sort keeps the first of equal scores first, as argmax does.
        pick = scores.sort(dim=1, descending=True, stable=True).indices[:, :n_best]  # (N, n)
        tokens = self.tokens.gather(1, pick.unsqueeze(-1).expand(-1, -1, self.tokens.size(-1))).tolist()  # (N, n, L)
        lengths, log_probs, scores = (x.gather(1, pick).tolist() for x in (lengths, log_probs, scores))  # (N, n)
        ranked = [[Hypothesis(t[:n], lp, s) for t, n, lp, s in zip(*row)] for row in zip(tokens, lengths, log_probs, scores)]
        # An empty slot (fewer finished hypotheses than asked for) has log-probability -inf.
        return [dataclasses.replace(row[0], alternatives=[h for h in row[1:] if h.log_prob > float("-inf")])
                for row in ranked]


def repeat_bans(history: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Which next tokens would repeat an n-gram already in each row's output (fairseq's
    --no-repeat-ngram-size): history (R, t) -> (R, t - n + 1) bool `match` and token ids `follow`;
    token follow[r, j] is banned in row r where match[r, j]. A row's n-gram j is banned when its
    first n - 1 tokens equal the row's last n - 1 tokens."""
    grams = history.unfold(1, n, 1)  # (R, t - n + 1, n)
    match = (grams[:, :, : n - 1] == history[:, history.size(1) - n + 1 :].unsqueeze(1)).all(-1)  # (R, t - n + 1)
    return match, grams[:, :, n - 1]


def _guard(log_probs: Tensor, history: Tensor, no_repeat_ngram: int, repetition_penalty: float) -> None:
    """The decoding guards, in place on log_probs (R, V) for rows whose outputs so far are history
    (R, t). Repetition penalty (CTRL, Keskar et al. 2019, as HF and CTranslate2 apply it): the
    log-probability of a token the row has already produced is multiplied by the penalty (it is
    ≤ 0, so the token gets less likely). No-repeat n-gram: a token that would complete an n-gram
    the row already holds gets -inf. Neither ever touches EOS, which no output holds."""
    if history.size(1) == 0:
        return
    if repetition_penalty != 1.0:
        log_probs.scatter_(1, history, log_probs.gather(1, history) * repetition_penalty)  # (R, t) values
    if no_repeat_ngram and history.size(1) >= no_repeat_ngram:
        match, follow = repeat_bans(history, no_repeat_ngram)  # (R, t - n + 1)
        hits = torch.zeros_like(log_probs, dtype=torch.int32).scatter_add_(1, follow, match.int())  # (R, V)
        log_probs.masked_fill_(hits > 0, float("-inf"))


def beam_search(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, beam: int = SECTION_6_1.beam,
    alpha: float = SECTION_6_1.alpha,
    min_len: int = 0, no_repeat_ngram: int = 0, repetition_penalty: float = 1.0, n_best: int = 1,
) -> list[Hypothesis]:
    """Beam search with the paper's settings as defaults (§6.1: beam 4, α = 0.6, the caller
    sets max_len = source length + 50). Returns the best finished hypothesis of each sentence.

    The rows are the live beams of the live sentences, flattened sentence-major: row b·k + j is
    beam j of live sentence b. State, on the device (B = live sentences, k = beams, t = tokens so
    far, V = vocabulary):
      scores (B, k) cumulative log-probabilities; history (B, k, t) tokens; limit (B,) max_len;
      alive (B,) the sentence of each live row group; finished (`_Finished`) per sentence.
    At step 0 only one beam per sentence exists (all beams would be equal), so the search starts
    with B rows and widens to B·k after the first step. Each step takes the top 2k candidates of
    (B, k·V) so that k of them continue even if up to k end in EOS; an EOS among the top k
    finishes a hypothesis. A sentence leaves the batch once it has k finished hypotheses (every
    beam has finished) or reaches max_len, where only EOS is allowed. Before `min_len` tokens EOS
    is barred. With beam 1 (greedy) there is nothing to rank, so a hypothesis that reaches
    max_len finishes there, without the step that would score its EOS.

    With `n_best` > 1 each result also holds the sentence's next best finished hypotheses (at most
    n_best - 1: a sentence that reached max_len may have fewer) as its `alternatives`.

    `no_repeat_ngram` (n > 0) and `repetition_penalty` (> 1) are the guards of fairseq, HF and
    CTranslate2 against outputs that loop; both are off by default, which is §6.1's search. A
    hypothesis' score is then the sum of the guarded log-probabilities.

    Length: one step of the search reads top to bottom here, as the state above describes it;
    cut into functions, that state would pass through each of them.
    """
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be between 1 and the beam ({beam}), got {n_best}")
    device = max_len.device
    batch = max_len.numel()
    limit_steps = set(max_len.tolist())  # steps at which some sentence may reach its limit
    finished = _Finished(batch, beam, max(limit_steps, default=0), device)
    alive = torch.arange(batch, device=device)
    limit = max_len.clone()
    scores = torch.zeros(batch, 1, device=device)
    history = torch.empty(batch, 1, 0, dtype=torch.long, device=device)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)
    t = 0
    while alive.numel():
        live, width = scores.shape
        log_probs = step(tokens).float()  # (B·k_cur, V)
        if no_repeat_ngram or repetition_penalty != 1.0:
            _guard(log_probs, history.reshape(live * width, t), no_repeat_ngram, repetition_penalty)
        log_probs = log_probs.view(live, width, -1)  # (B, k_cur, V)
        vocab = log_probs.size(-1)
        at_limit = limit <= t  # (B,)
        candidates = scores.unsqueeze(-1) + log_probs  # (B, k_cur, V)
        if t < min_len or t in limit_steps:
            eos = torch.arange(vocab, device=device) == eos_id  # (V,)
            barred = eos if t < min_len else torch.zeros_like(eos)
            barred = torch.where(at_limit[:, None, None], ~eos, barred)  # (B, 1, V)
            candidates.masked_fill_(barred, float("-inf"))  # in place: a (B, k, V) copy less per step
        candidates = candidates.view(live, width * vocab)  # (B, k_cur·V)
        top_scores, top = candidates.topk(min(2 * beam, width * vocab), dim=1)  # (B, 2k)
        parent, token = top // vocab, top % vocab  # (B, 2k)
        is_eos = token == eos_id
        ends = is_eos[:, :beam] & (top_scores[:, :beam] > float("-inf"))  # (B, k)
        paths = history.gather(1, parent[:, :beam, None].expand(-1, -1, t))  # (B, k, t)
        finished.add(alive, ends, top_scores[:, :beam], paths)
        # The k best candidates that do not end in EOS continue (a stable sort keeps the ranking).
        pick = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :beam]  # (B, k)
        scores, parent, token = top_scores.gather(1, pick), parent.gather(1, pick), token.gather(1, pick)  # (B, k)
        history = torch.cat([history.gather(1, parent.unsqueeze(-1).expand(-1, -1, t)), token.unsqueeze(-1)], -1)
        done = at_limit | (finished.count[alive] >= beam)  # (B,)
        if beam == 1:
            full = ~done & (limit <= t + 1)  # (B,)
            finished.add(alive, full.unsqueeze(1), scores, history)
            done |= full
        n_done = int(done.sum())  # the one number read back per step
        if n_done == live:
            break
        keep = (~done).nonzero().squeeze(1) if n_done else torch.arange(live, device=device)  # (B',)
        if n_done or beam > 1:  # greedy rows never move unless sentences leave
            reorder((keep.unsqueeze(1) * width + parent[keep]).flatten(), keep, beam)  # parents' rows (B'·k,)
        scores, history, tokens = scores[keep], history[keep], token[keep].flatten()
        alive, limit = alive[keep], limit[keep]
        t += 1
    return finished.best(alpha, n_best)


def greedy(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, min_len: int = 0, **guards
) -> list[list[int]]:
    """The most probable token at each step until EOS or `max_len` (B,) tokens; EOS is barred
    before `min_len` tokens (fairseq's --min-len, HF's min_new_tokens). It is beam search with
    one beam (`guards`: its no_repeat_ngram and repetition_penalty). Returns, per sentence, the
    tokens without BOS and EOS."""
    return [h.tokens for h in beam_search(step, reorder, bos_id, eos_id, max_len, beam=1, alpha=0.0, min_len=min_len,
                                          **guards)]
