"""Decoding (§6.1): beam search and greedy search over a step function, decoupled from the model.

A search talks to the model through two calls (aiayn.translate.ModelStep adapts a Transformer):
  step(tokens)                        tokens: (B,) the last token of each live row ->
                                      log-probabilities (B, V) of the next token
  reorder(rows, sentences, beam)      continue with rows `rows` (M'·beam,), sentence-major: the
                                      beams of the sentences `sentences` (M',) among those live
The search state stays on the device of `max_len`: no step copies scores to the host or loops
over sentences in Python. Each step reads back once (more on the steps where sentences leave):
how many sentences are done, which decides whether the batch shrinks, and how many hypotheses
ended (and, in greedy search, reached their limit), without which nothing is added to the
finished ones.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.config import DECODE_PRESETS, DecodeConfig, check_whole

StepFn = Callable[[Tensor], Tensor]
ReorderFn = Callable[[Tensor, Tensor, int], None]


SECTION_6_1 = DECODE_PRESETS["translate"]  # beam 4, α 0.6
STOP_RULES = typing.get_args(typing.get_type_hints(DecodeConfig)["stop"])  # ("beams", "bound")


def length_penalty(length, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), the one §6.1 uses with α = 0.6.
    (fairseq's |Y|^α is a different penalty.) |Y| counts the output tokens and the EOS; numbers
    or tensors."""
    return ((5 + length) / 6) ** alpha


def final_score(log_probs, lengths, alpha):
    """A finished hypothesis' score, log P / lp(|Y|), from its log-probability and its `lengths`
    (output tokens without the EOS, which lp counts); numbers or tensors."""
    return log_probs / length_penalty(lengths + 1, alpha)


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    log_prob: float  # log P(tokens, EOS | source)
    score: float  # log_prob / length_penalty
    # With n_best > 1: the sentence's next best finished hypotheses, best first (LibreTranslate's
    # "alternatives"); empty otherwise.
    alternatives: list["Hypothesis"] = field(default_factory=list)


class _Finished:
    """The finished hypotheses of each sentence decoding, on the device, its rows in step with
    the search's sentences (M sentences, k = beam, L = the longest output any may reach):
    tokens (M, k + 1, L) right-aligned (a hypothesis of n tokens in the last n columns), lengths
    (M, k + 1), log_probs (M, k + 1), count (M,). Slot k takes the hypotheses beyond a sentence's
    k-th, which are never read."""

    def __init__(self, beam: int, device: torch.device) -> None:
        self.beam = beam
        self.tokens = torch.zeros(0, beam + 1, 1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(0, beam + 1, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(0, beam + 1, device=device)
        self.count = torch.zeros(0, dtype=torch.long, device=device)

    def join(self, sentences: int, longest: int) -> None:
        """Room for `sentences` more, whose outputs reach at most `longest` tokens."""
        width = max(longest, self.tokens.size(-1))
        tokens = F.pad(self.tokens, (width - self.tokens.size(-1), 0))  # (M, k + 1, width)
        self.tokens = torch.cat([tokens, tokens.new_zeros(sentences, self.beam + 1, width)])
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(sentences, self.beam + 1)])
        self.log_probs = torch.cat([self.log_probs, self.log_probs.new_full((sentences, self.beam + 1), float("-inf"))])
        self.count = torch.cat([self.count, self.count.new_zeros(sentences)])

    def keep(self, sentences: Tensor, longest: int) -> None:
        """Only `sentences` (M',) go on, whose outputs reach at most `longest` tokens."""
        self.tokens = self.tokens[sentences, :, self.tokens.size(-1) - max(longest, 1) :]
        self.lengths, self.log_probs, self.count = self.lengths[sentences], self.log_probs[sentences], self.count[sentences]

    def add(self, ends: Tensor, log_probs: Tensor, tokens: Tensor, lengths: Tensor) -> None:
        """Every sentence finishes the hypotheses where `ends` (M, j) is set, with their
        log-probabilities (M, j) and output tokens (M, j, t), right-aligned, `lengths` (M,) of
        them real, in rank order."""
        slot = self.count.unsqueeze(1) + ends.cumsum(1) - 1  # (M, j)
        slot = torch.where(ends & (slot < self.beam), slot, self.beam)
        sentence = torch.arange(slot.size(0), device=slot.device).unsqueeze(1).expand_as(slot)  # (M, j)
        self.tokens[sentence, slot, self.tokens.size(-1) - tokens.size(-1) :] = tokens
        self.lengths[sentence, slot] = lengths.unsqueeze(1)
        self.log_probs[sentence, slot] = log_probs
        self.count = (self.count + ends.sum(1)).clamp(max=self.beam)

    def add_best(self, ends: Tensor, log_probs: Tensor, tokens: Tensor, lengths: Tensor, alpha: Tensor) -> None:
        """As `add`, but a sentence keeps its k best-scored hypotheses (under its α (M, 1)) rather
        than its first k: tensor2tensor's search goes on after k have finished, and a later one
        may score better. Ties keep the earlier hypothesis."""
        beam, width = self.beam, self.tokens.size(-1)
        lengths = torch.cat([self.lengths[:, :beam], lengths.unsqueeze(1).expand_as(ends)], 1)  # (M, k + j)
        log_probs = torch.cat([self.log_probs[:, :beam], torch.where(ends, log_probs, float("-inf"))], 1)  # (M, k + j)
        keep = final_score(log_probs, lengths, alpha).sort(dim=1, descending=True, stable=True).indices[:, :beam]  # (M, k)
        tokens = torch.cat([self.tokens[:, :beam], F.pad(tokens, (width - tokens.size(-1), 0))], 1)  # (M, k + j, L)
        self.tokens[:, :beam] = tokens.gather(1, keep.unsqueeze(-1).expand(-1, -1, width))
        self.lengths[:, :beam], self.log_probs[:, :beam] = lengths.gather(1, keep), log_probs.gather(1, keep)
        self.count = (self.count + ends.sum(1)).clamp(max=beam)

    def best(self, sentences: Tensor, alpha: float, n_best: int = 1) -> list[Hypothesis]:
        """The finished hypothesis with the best score of each of `sentences` (the first on a
        tie), with the next `n_best` - 1 of it, by score, as its `alternatives`."""
        log_probs, lengths = self.log_probs[sentences, : self.beam], self.lengths[sentences, : self.beam]  # (N, k)
        scores = final_score(log_probs, lengths, alpha)  # (N, k)
        # A stable sort keeps the first of equal scores first, as argmax does.
        pick = scores.sort(dim=1, descending=True, stable=True).indices[:, :n_best]  # (N, n)
        tokens = self.tokens[sentences].gather(1, pick.unsqueeze(-1).expand(-1, -1, self.tokens.size(-1))).tolist()  # (N, n, L)
        lengths, log_probs, scores = (x.gather(1, pick).tolist() for x in (lengths, log_probs, scores))  # (N, n)
        ranked = [[Hypothesis(t[len(t) - n :], lp, s) for t, n, lp, s in zip(*row)]
                  for row in zip(tokens, lengths, log_probs, scores)]
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


def _guard(log_probs: Tensor, history: Tensor, pad: int, no_repeat_ngram: int, repetition_penalty: float) -> None:
    """The decoding guards, in place on log_probs (R, V) for rows whose outputs so far are history
    (R, t), right-aligned after `pad` (the EOS, which no output holds). Repetition penalty (CTRL,
    Keskar et al. 2019, as HF and CTranslate2 apply it): the log-probability of a token the row
    has already produced is multiplied by the penalty (it is ≤ 0, so the token gets less likely).
    No-repeat n-gram: a token that would complete an n-gram the row already holds gets -inf.
    Neither ever touches EOS."""
    if history.size(1) == 0:
        return
    if repetition_penalty != 1.0:
        eos = log_probs[:, pad].clone()  # the padding's scatter below must leave EOS as it was
        log_probs.scatter_(1, history, log_probs.gather(1, history) * repetition_penalty)  # (R, t) values
        log_probs[:, pad] = eos
    if no_repeat_ngram and history.size(1) >= no_repeat_ngram:
        match, follow = repeat_bans(history, no_repeat_ngram)  # (R, t - n + 1)
        match &= history.unfold(1, no_repeat_ngram, 1)[:, :, 0] != pad  # an n-gram with padding in it is none
        hits = torch.zeros_like(log_probs, dtype=torch.int32).scatter_add_(1, follow, match.int())  # (R, V)
        log_probs.masked_fill_(hits > 0, float("-inf"))


class BeamSearch:
    """The state of beam search (§6.1) between steps, so that sentences can join it and leave it
    while it runs (continuous batching: a server's new requests enter between two steps, and a
    finished sentence leaves at once). `beam_search` below is one batch joining at step 0.

    The rows are the live beams of the live sentences, flattened sentence-major: row b·w + j is
    beam j of live sentence b, w the width (1 before the first step, then k = beam). State, on
    the device (B = live sentences, t = steps taken, V = vocabulary):
      scores (B, w) cumulative log-probabilities; history (B, w, W) the tokens output so far,
      right-aligned (sentence b has output t - joined[b] of them; the columns before are EOS);
      joined (B,) the step each sentence joined at; deadline (B,) the step it reaches max_len;
      finished (`_Finished`) its finished hypotheses.
    Each step takes the top 2k candidates of (B, w·V) so that k of them continue even if up to k
    end in EOS; an EOS among the top k finishes a hypothesis. A sentence leaves once it has k
    finished hypotheses (every beam has finished) or reaches max_len, where only EOS is allowed:
    `stop` "beams", fairseq's rule. With `stop` "bound" (tensor2tensor's, beam > 1) a sentence
    leaves once its best finished score (its n_best-th best, with alternatives) beats the best a
    live beam could reach, its cumulative log-probability over lp(max_len) (log-probabilities
    only fall, and α ≥ 0 makes lp grow with the length), and keeps its k best-scored finished
    hypotheses, not its first k.
    Before `min_len` tokens EOS is barred. With beam 1 (greedy) there is nothing to rank, so a
    hypothesis that reaches max_len finishes there, without the step that would score its EOS.

    A sentence that joins a running search comes with w rows, the first with score 0 and the
    others -inf, so no candidate of theirs is ranked: its first step has one beam, as at step 0.
    The caller gives its model state the same rows (`join` returns w). `no_repeat_ngram` (n > 0)
    and `repetition_penalty` (> 1) are the guards of fairseq, HF and CTranslate2 against outputs
    that loop; off by default, which is §6.1's search. A hypothesis' score is then the sum of the
    guarded log-probabilities.
    """

    def __init__(self, step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, device: torch.device,
                 beam: int = SECTION_6_1.beam, min_len: int = 0, no_repeat_ngram: int = 0,
                 repetition_penalty: float = 1.0, stop: str = SECTION_6_1.stop) -> None:
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        if stop not in STOP_RULES:
            raise ValueError(f"stop is one of {', '.join(STOP_RULES)}, got {stop!r}")
        self.bound = stop == "bound" and beam > 1  # greedy stops at its EOS either way
        self.model_step, self.reorder = step, reorder
        self.bos_id, self.eos_id, self.device, self.beam = bos_id, eos_id, device, beam
        self.min_len, self.no_repeat_ngram, self.repetition_penalty = min_len, no_repeat_ngram, repetition_penalty
        self.t = 0
        self.scores = torch.zeros(0, 1, device=device)
        self.history = torch.empty(0, 1, 0, dtype=torch.long, device=device)
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        self.joined = torch.empty(0, dtype=torch.long, device=device)
        self.deadline = torch.empty(0, dtype=torch.long, device=device)
        self.alpha = torch.empty(0, 1, device=device)  # (B, 1) each sentence's α, for the bound rule
        self.n_best = torch.empty(0, dtype=torch.long, device=device)  # (B,) and its n_best
        self.finished = _Finished(beam, device)
        # On the host, per live sentence: the caller's key, (alpha, n_best), the step it joined,
        # its deadline. Steps read nothing back for them but their counts of sentences done and
        # of hypotheses ended.
        self.keys: list = []
        self.settings: list[tuple[float, int]] = []
        self._joined: list[int] = []
        self._deadlines: list[int] = []

    @property
    def live(self) -> int:
        """Sentences still decoding."""
        return len(self.keys)

    def check_n_best(self, n_best: int) -> None:
        self.check_n_best_of(n_best, self.beam)

    @staticmethod
    def check_n_best_of(n_best: int, beam: int) -> None:
        """n_best, a whole number from 1 to the beam (found by a misuse hunt: 2.0 was a slice's
        TypeError after the search, None and "2" a comparison's)."""
        check_whole(n_best=n_best)
        if not 1 <= n_best <= beam:
            raise ValueError(f"n_best must be between 1 and the beam ({beam}), got {n_best}")

    @property
    def width(self) -> int:
        """Rows per sentence: what the model state of a sentence joining now needs."""
        return self.scores.size(1) if self.live else 1

    def join(self, max_len: Tensor, keys: list, alpha: float = SECTION_6_1.alpha, n_best: int = 1) -> int:
        """Sentences join after those decoding, with at most `max_len` (N,) output tokens each;
        `step` gives back their `keys` as they finish, with their best hypothesis under `alpha`
        and n_best - 1 alternatives. Their model state has `width` rows each (returned)."""
        self.check_n_best(n_best)
        check_limits(max_len)
        if self.bound and alpha < 0:  # (found in review: lp would fall with the length, and bound nothing)
            raise ValueError(f"the bound stop rule needs α ≥ 0, got {alpha}")
        width, count, limits = self.width, max_len.numel(), max_len.tolist()
        if not self.live:
            self.t = 0
            self.scores = self.scores.new_zeros(0, 1)
            self.history = self.history.new_zeros(0, 1, 0)
        scores = self.scores.new_full((count, width), float("-inf"))
        scores[:, 0] = 0
        self.scores = torch.cat([self.scores, scores])
        self.history = torch.cat([self.history, self.history.new_full((count, width, self.history.size(2)), self.eos_id)])
        self.tokens = torch.cat([self.tokens, self.tokens.new_full((count * width,), self.bos_id)])
        self.joined = torch.cat([self.joined, self.joined.new_full((count,), self.t)])
        self.deadline = torch.cat([self.deadline, max_len.to(self.device) + self.t])
        self.alpha = torch.cat([self.alpha, self.alpha.new_full((count, 1), alpha)])
        self.n_best = torch.cat([self.n_best, self.n_best.new_full((count,), n_best)])
        self.finished.join(count, max(limits, default=0))
        self.keys += keys
        self.settings += [(alpha, n_best)] * count
        self._joined += [self.t] * count
        self._deadlines += [self.t + limit for limit in limits]
        return width

    def cut(self, which: Callable[[Any], bool]) -> list:
        """The live sentences whose key `which` holds finish at the next step, with what they have
        output so far: their limit becomes now, so that step allows them EOS alone, as at max_len
        (a server's client that has gone: its texts stop costing steps). Returns their keys."""
        rows = [i for i, key in enumerate(self.keys) if which(key)]
        if rows:
            self.deadline = self.deadline.index_fill(0, torch.tensor(rows, device=self.device), self.t)  # (B,)
            for i in rows:
                self._deadlines[i] = self.t
        return [self.keys[i] for i in rows]

    def step(self) -> list[tuple]:
        """One decoding step of every live sentence; returns (key, Hypothesis) of those that
        finished.

        Length: one step of the search reads top to bottom here, as the state above describes it;
        cut into functions, that state would pass through each of them.
        """
        beam, t, device = self.beam, self.t, self.device
        live, width = self.scores.shape
        log_probs = self.model_step(self.tokens).float()  # (B·w, V)
        if self.no_repeat_ngram or self.repetition_penalty != 1.0:
            _guard(log_probs, self.history.reshape(live * width, -1), self.eos_id, self.no_repeat_ngram,
                   self.repetition_penalty)
        log_probs = log_probs.view(live, width, -1)  # (B, w, V)
        vocab = log_probs.size(-1)
        at_limit = self.deadline <= t  # (B,)
        candidates = self.scores.unsqueeze(-1) + log_probs  # (B, w, V)
        if t < max(self._joined) + self.min_len or t in self._deadlines:
            eos = torch.arange(vocab, device=device) == self.eos_id  # (V,)
            barred = eos & (t - self.joined < self.min_len)[:, None, None]  # (B, 1, V)
            barred = torch.where(at_limit[:, None, None], ~eos, barred)  # (B, 1, V)
            candidates.masked_fill_(barred, float("-inf"))  # in place: a (B, k, V) copy less per step
        candidates = candidates.view(live, width * vocab)  # (B, w·V)
        top_scores, top = candidates.topk(min(2 * beam, width * vocab), dim=1)  # (B, 2k)
        candidate_parent, token = top // vocab, top % vocab  # (B, 2k)
        is_eos = token == self.eos_id
        ends = is_eos[:, :beam] & (top_scores[:, :beam] > float("-inf"))  # (B, k)
        steps = t - self.joined  # (B,) tokens output so far
        # The k best candidates that do not end in EOS continue (a stable sort keeps the ranking).
        pick = torch.sort(is_eos.int(), dim=1, stable=True).indices[:, :beam]  # (B, k)
        scores, parent, token = top_scores.gather(1, pick), candidate_parent.gather(1, pick), token.gather(1, pick)  # (B, k)
        # Of the min(2k, w·V) candidates at most w end in EOS (one a row), so fewer than k do not
        # only where w·(V - 1) < k (a beam near the vocabulary's size): an EOS picked to fill the
        # beam must not go on as text, so it goes on as a hypothesis that never wins.
        if width * (vocab - 1) < beam:
            scores = scores.masked_fill(token == self.eos_id, float("-inf"))
        history = torch.cat([self.history.gather(1, parent.unsqueeze(-1).expand(-1, -1, self.history.size(2))),
                             token.unsqueeze(-1)], -1)  # (B, k, W + 1)
        # Each sentence's finished count once this step's ends are added (as _Finished.add counts
        # them): most steps end no hypothesis, so the ends are added only on the steps that have
        # one, which the step's one read tells along with the sentences done.
        if self.bound:
            # The n_best-th best finished score, this step's ends counted (with alternatives, each
            # of them must be final; found in review), against the best a live beam could reach:
            # its log-probability over lp at the sentence's limit (deadline - joined).
            ended = torch.where(ends, final_score(top_scores[:, :beam], steps.unsqueeze(1), self.alpha), float("-inf"))
            finished = final_score(self.finished.log_probs[:, :beam], self.finished.lengths[:, :beam], self.alpha)
            ranked = torch.cat([finished, ended], 1).sort(dim=1, descending=True).values  # (B, 2k)
            last = ranked.gather(1, (self.n_best - 1).unsqueeze(1)).squeeze(1)  # (B,)
            done = at_limit | (last > final_score(scores[:, 0], self.deadline - self.joined, self.alpha[:, 0]))
        else:
            done = at_limit | ((self.finished.count + ends.sum(1)).clamp(max=beam) >= beam)  # (B,)
        full = ~done & (self.deadline <= t + 1) if beam == 1 else None  # (B,)
        done = done if full is None else done | full
        counts = [done.sum(), ends.sum()] + ([] if full is None else [full.sum()])
        n_done, n_ends, *n_full = torch.stack(counts).tolist()  # the one read a step
        if n_ends:
            paths = self.history.gather(1, candidate_parent[:, :beam, None].expand(-1, -1, self.history.size(2)))  # (B, k, W)
            if self.bound:
                self.finished.add_best(ends, top_scores[:, :beam], paths, steps, self.alpha)
            else:
                self.finished.add(ends, top_scores[:, :beam], paths, steps)
        if any(n_full):  # greedy hypotheses at their limit finish without the step that would score EOS
            self.finished.add(full.unsqueeze(1), scores, history, steps + 1)
        self.t += 1
        if not n_done:
            if beam > 1:  # greedy rows never move unless sentences leave
                every = torch.arange(live, device=device)  # (B,)
                self.reorder((every.unsqueeze(1) * width + parent).flatten(), every, beam)
            self.scores, self.history, self.tokens = scores, history, token.flatten()
            return []
        leaving = done.nonzero().squeeze(1)  # (N,)
        results = self._results(leaving)
        keep = (~done).nonzero().squeeze(1)  # (B',)
        kept = keep.tolist()
        self.keys, self.settings = [self.keys[i] for i in kept], [self.settings[i] for i in kept]
        self._joined, self._deadlines = [self._joined[i] for i in kept], [self._deadlines[i] for i in kept]
        if kept:
            self.reorder((keep.unsqueeze(1) * width + parent[keep]).flatten(), keep, beam)  # parents' rows (B'·k,)
        oldest = self.t - min(self._joined, default=self.t)  # the most tokens a live sentence has output
        self.scores, self.tokens = scores[keep], token[keep].flatten()
        self.history = history[keep, :, history.size(2) - oldest :]
        self.joined, self.deadline, self.alpha = self.joined[keep], self.deadline[keep], self.alpha[keep]
        self.n_best = self.n_best[keep]
        self.finished.keep(keep, max((d - j for d, j in zip(self._deadlines, self._joined)), default=1))
        return results

    def _results(self, leaving: Tensor) -> list[tuple]:
        """(key, best hypothesis) of the sentences `leaving` (N,), in their order."""
        rows = leaving.tolist()
        by_setting: dict[tuple[float, int], list[int]] = {}
        for i, row in enumerate(rows):
            by_setting.setdefault(self.settings[row], []).append(i)
        best: list = [None] * len(rows)
        for (alpha, n_best), positions in by_setting.items():
            for i, hypothesis in zip(positions, self.finished.best(leaving[positions], alpha, n_best)):
                best[i] = hypothesis
        return [(self.keys[row], hypothesis) for row, hypothesis in zip(rows, best)]


def check_limits(max_len) -> None:
    """A search's output limits are a tensor, one per sentence: an int would fail inside it."""
    if not isinstance(max_len, Tensor) or max_len.dim() != 1 or max_len.dtype.is_floating_point or max_len.dtype == torch.bool:
        got = f"a {max_len.dtype} tensor of shape {tuple(max_len.shape)}" if isinstance(max_len, Tensor) else repr(max_len)
        raise TypeError(f"max_len is each sentence's limit, an integer tensor (B,) such as torch.full((B,), 60); got {got}")


def beam_search(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, beam: int = SECTION_6_1.beam,
    alpha: float = SECTION_6_1.alpha,
    min_len: int = 0, no_repeat_ngram: int = 0, repetition_penalty: float = 1.0, n_best: int = 1,
    stop: str = SECTION_6_1.stop,
) -> list[Hypothesis]:
    """Beam search with the paper's settings as defaults (§6.1: beam 4, α = 0.6, the caller
    sets max_len = source length + 50) over a batch of sentences whose model state `step` and
    `reorder` already hold (one row per sentence: `BeamSearch` widens them to k after the first
    step). Returns the best finished hypothesis of each sentence, with, for `n_best` > 1, its
    next best finished ones (at most n_best - 1: a sentence that reached max_len may have fewer)
    as its `alternatives`. The guards and `stop`: those of `BeamSearch`."""
    check_limits(max_len)
    search = BeamSearch(step, reorder, bos_id, eos_id, max_len.device, beam, min_len, no_repeat_ngram,
                        repetition_penalty, stop)
    search.join(max_len, list(range(max_len.numel())), alpha, n_best)
    results: list = [None] * max_len.numel()
    while search.live:
        for key, hypothesis in search.step():
            results[key] = hypothesis
    return results


def greedy(
    step: StepFn, reorder: ReorderFn, bos_id: int, eos_id: int, max_len: Tensor, min_len: int = 0, **guards
) -> list[list[int]]:
    """The most probable token at each step until EOS or `max_len` (B,) tokens; EOS is barred
    before `min_len` tokens (fairseq's --min-len, HF's min_new_tokens). It is beam search with
    one beam (`guards`: its no_repeat_ngram and repetition_penalty). Returns, per sentence, the
    tokens without BOS and EOS."""
    return [h.tokens for h in beam_search(step, reorder, bos_id, eos_id, max_len, beam=1, alpha=0.0, min_len=min_len,
                                          **guards)]
