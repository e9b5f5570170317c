"""Search (§6.1) with scripted per-step probabilities, as fairseq's and OpenNMT's tests do, and
against the model: greedy = argmax of the full forward, cached = uncached, batched = one sentence
at a time."""

import dataclasses
import math

import pytest
import torch

from aiayn.config import DECODE_PRESETS, PRESETS, ModelConfig
from aiayn.model import Transformer
from aiayn.search import beam_search, greedy, length_penalty
from aiayn.translate import ContinuousDecoding, ModelStep, translate_nbest

BOS, EOS, VOCAB = 1, 2, 6


class Scripted:
    """A step function whose next-token distribution depends on the row's prefix only."""

    def __init__(self, table: dict, rows: int = 1) -> None:
        self.table = table
        self.prefixes = [()] * rows
        self.widths = []  # rows per step: finished sentences must leave

    def step(self, tokens):
        self.widths.append(tokens.numel())
        if self.prefixes and self.prefixes[0] != () or tokens[0] != BOS:
            self.prefixes = [p + (int(t),) for p, t in zip(self.prefixes, tokens)]
        else:
            self.prefixes = [() for _ in tokens]
        probs = torch.full((tokens.numel(), VOCAB), 1e-9)
        for row, prefix in enumerate(self.prefixes):
            for token, p in self.table.get(prefix, {EOS: 1.0}).items():
                probs[row, token] = p
        return probs.log()

    def reorder(self, rows, sentences, beam):
        assert rows.numel() == sentences.numel() * beam
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]


TABLE = {
    (): {3: 0.5, 4: 0.4, EOS: 0.1},
    (3,): {EOS: 0.6, 5: 0.4},
    (4,): {5: 0.9, EOS: 0.1},
    (4, 5): {EOS: 0.8, 3: 0.2},
    (3, 5): {EOS: 1.0},
}


def test_scripted_beam_search_gives_exact_hypotheses_and_scores():
    # Greedy takes 3 then EOS: P = 0.5 * 0.6 = 0.3.
    s = Scripted(TABLE)
    assert greedy(s.step, s.reorder, BOS, EOS, torch.tensor([10])) == [[3]]
    # Beam 2 without length penalty finds the same best: 0.3 > 4,5 = 0.4 * 0.9 * 0.8 = 0.288.
    s = Scripted(TABLE)
    best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.0)[0]
    assert best.tokens == [3] and best.log_prob == pytest.approx(math.log(0.3), abs=1e-6)
    # With the paper's α = 0.6 the longer hypothesis wins: log 0.288 / ((5+3)/6)^0.6 beats
    # log 0.3 / ((5+2)/6)^0.6 (|Y| counts the EOS).
    s = Scripted(TABLE)
    best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.6)[0]
    assert best.tokens == [4, 5]
    assert best.log_prob == pytest.approx(math.log(0.288), abs=1e-6)
    assert best.score == pytest.approx(math.log(0.288) / (8 / 6) ** 0.6, abs=1e-6)
    # Step 0 runs one row (only the first beam is live), then 2 beams; after step 2 the sentence
    # has 2 finished hypotheses and stops.
    assert s.widths == [1, 2, 2]


def test_n_best_gives_the_next_finished_hypotheses_in_score_order():
    """Beam 2 finishes [3] (P 0.3) and [4, 5] (P 0.288): with α 0 the first is best and the other its
    alternative, with α 0.6 the other way round; n_best 1 keeps none, n_best over the beam is refused."""
    for alpha, order in ((0.0, [[3], [4, 5]]), (0.6, [[4, 5], [3]])):
        s = Scripted(TABLE)
        best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=alpha, n_best=2)[0]
        assert [best.tokens] + [h.tokens for h in best.alternatives] == order
        assert best.score >= best.alternatives[0].score
        expected = {(3,): math.log(0.3), (4, 5): math.log(0.288)}
        assert best.alternatives[0].log_prob == pytest.approx(expected[tuple(order[1])], abs=1e-6)
    s = Scripted(TABLE)
    assert beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.0)[0].alternatives == []
    with pytest.raises(ValueError, match="n_best must be between 1 and the beam"):
        beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, n_best=3)


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert length_penalty(30, 0.0) == 1.0


def test_eos_cannot_starve_the_beam():
    """When EOS ranks high in every beam, 2k candidates still leave k live hypotheses."""
    table = {(): {3: 0.6, 4: 0.4}, (3,): {EOS: 0.7, 5: 0.3}, (4,): {EOS: 0.7, 5: 0.3}, (3, 5): {EOS: 1.0}, (4, 5): {EOS: 1.0}}
    s = Scripted(table)
    best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.0)[0]
    assert best.tokens == [3] and best.log_prob == pytest.approx(math.log(0.42), abs=1e-6)


def test_max_len_forces_eos_and_finished_sentences_leave():
    never_ends = {(): {3: 1.0}, (3,): {3: 1.0}, (3, 3): {3: 1.0}, (3, 3, 3): {3: 1.0}}
    s = Scripted({**never_ends, (3, 3, 3, 3): {3: 1.0}}, rows=2)
    tokens = torch.tensor([BOS, BOS])
    out = greedy(s.step, s.reorder, BOS, EOS, torch.tensor([2, 4]))
    assert out == [[3, 3], [3, 3, 3, 3]]
    assert s.widths == [2, 2, 1, 1]
    s = Scripted(never_ends, rows=2)
    hyps = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([1, 3]), beam=2)
    assert [h.tokens for h in hyps] == [[3], [3, 3, 3]]
    assert s.widths[-1] == 2  # only the longer sentence's two beams were left
    assert tokens.tolist() == [BOS, BOS]


class Hashed:
    """A step function whose log-probabilities are random but fixed per (sentence, prefix): a
    distribution over VOCAB + 2 tokens, sharp enough that beams end at different steps. Rows are
    tracked as the search moves them; `join` adds a sentence's rows as the search asks."""

    VOCAB = VOCAB + 2

    def __init__(self, seed: int) -> None:
        self.seed, self.prefixes = seed, []

    def log_probs(self, prefix: tuple) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**62)
        return torch.log_softmax(torch.randn(self.VOCAB, generator=generator) * 3, dim=-1)  # (V,) fp32

    def join(self, sentence: int, rows: int) -> None:
        self.prefixes += [(sentence,)] * rows

    def step(self, tokens):
        self.prefixes = [p + (int(t),) for p, t in zip(self.prefixes, tokens, strict=True)]
        return torch.stack([self.log_probs(p) for p in self.prefixes])  # (B, V)

    def reorder(self, rows, sentences, beam):
        self.prefixes = [self.prefixes[i] for i in rows.tolist()]


def reference_beam_search(model: Hashed, sentence: int, beam: int, max_len: int, alpha: float, min_len: int,
                          n_best: int, stop: str = "beams") -> list:
    """§6.1's search for one sentence, written plainly: every candidate of every beam ranked in
    Python; an EOS among the k best finishes a hypothesis (up to k are kept, in the order found),
    the k best others go on; the sentence ends with k finished or at max_len, where only EOS may
    follow (greedy: a hypothesis at max_len finishes there); EOS barred before min_len unless at
    max_len; the best
    by log P / lp(|Y| + 1), then the next n_best - 1. Returns [(tokens, log P)] best first.
    `stop` "bound" (beam > 1): the k best-scored finished are kept, and the sentence ends once the
    n_best-th best of them outscores the best live beam's log P / lp(max_len + 1)."""
    def final(tokens, c):
        return torch.tensor(c) / ((5 + len(tokens) + 1) / 6) ** alpha

    beams, finished = [((), torch.tensor(0.0))], []
    for t in range(max_len + 1):
        candidates = []
        for j, (tokens, score) in enumerate(beams):
            log_probs = model.log_probs((sentence, BOS) + tokens)
            for v in range(model.VOCAB):
                barred = v != EOS if t == max_len else v == EOS and t < min_len  # the limit before min_len
                candidates.append((float("-inf") if barred else (score + log_probs[v]).item(), j, v))
        top = sorted(candidates, key=lambda c: -c[0])[: 2 * beam]
        finished += [(beams[j][0], c) for c, j, v in top[:beam] if v == EOS and c > float("-inf")]
        going = [(beams[j][0] + (v,), torch.tensor(c)) for c, j, v in top if v != EOS][:beam]
        if stop == "bound" and beam > 1:
            finished = sorted(finished, key=lambda f: -final(*f).item())[:beam]
            ranked = sorted((final(*f).item() for f in finished), reverse=True)
            last = ranked[n_best - 1] if len(ranked) >= n_best else float("-inf")
            if t == max_len or last > (going[0][1] / ((5 + max_len + 1) / 6) ** alpha).item():
                break
        elif len(finished) >= beam or t == max_len:
            break
        beams = going
        if beam == 1 and t + 1 == max_len:
            finished.append((beams[0][0], beams[0][1].item()))
            break
    kept = finished[:beam]
    scores = [final(tokens, c) for tokens, c in kept]
    order = sorted(range(len(kept)), key=lambda i: -scores[i].item())  # stable: the first of equals first
    return [(list(kept[i][0]), kept[i][1]) for i in order[:n_best]]


@pytest.mark.parametrize("stop", ["beams", "bound"])
@pytest.mark.parametrize("beam, alpha, min_len", [(1, 0.0, 0), (2, 0.6, 0), (3, 0.6, 2), (4, 1.0, 0), (4, 0.6, 3)])
def test_the_search_finds_what_a_plain_beam_search_finds_with_sentences_joining_as_it_runs(beam, alpha, min_len, stop):
    """BeamSearch keeps every sentence's state in tensors and lets sentences join between steps;
    each sentence must get what the plain search above gets for it alone: the same outputs, best
    and alternatives, with the same log-probabilities (the same fp32 sums), under either rule."""
    from aiayn.search import BeamSearch

    ended = 0
    for seed in range(4):
        model = Hashed(seed)
        search = BeamSearch(model.step, model.reorder, BOS, EOS, torch.device("cpu"), beam, min_len, stop=stop)
        limits = {0: 6, 1: 3, 2: 9, 3: 1, 4: 7, 5: 5}
        joining, got, step = {0: [0, 1], 1: [2], 3: [3, 4], 9: [5]}, {}, 0
        while joining or search.live:
            due = joining.pop(step, []) if search.live else joining.pop(min(joining))
            if not search.live:  # the rows of sentences that all left (no reorder told of it)
                model.prefixes = []
            for sentence in due:
                model.join(sentence, search.width)
            if due:
                search.join(torch.tensor([limits[s] for s in due]), due, alpha, n_best=beam)
            got.update(search.step())
            step += 1
        assert sorted(got) == list(limits)
        for sentence, hypothesis in got.items():
            expected = reference_beam_search(model, sentence, beam, limits[sentence], alpha, min_len, beam, stop)
            found = [hypothesis] + hypothesis.alternatives
            assert [(h.tokens, h.log_prob) for h in found] == expected, (seed, sentence)
            ended += len(hypothesis.tokens) < limits[sentence]
    assert ended  # some outputs ended by EOS, not only at their limits


def search_one(model: Hashed, sentence: int, beam: int, alpha: float, limit: int, stop: str):
    """beam_search of one sentence of `model`: its best hypothesis and the steps it took."""
    model.prefixes, steps = [], []
    model.join(sentence, 1)
    step = lambda tokens: steps.append(1) or model.step(tokens)  # noqa: E731
    return beam_search(step, model.reorder, BOS, EOS, torch.tensor([limit]), beam, alpha, stop=stop)[0], len(steps)


def test_the_bound_rule_never_scores_below_the_beams_rule_and_sometimes_above():
    """tensor2tensor's rule keeps the beams fairseq's rule keeps (which beams go on does not depend
    on what has finished) and ends a sentence only when no live beam can outscore its best, so its
    best never scores lower; where fairseq's rule ends at k finished while a live beam would still
    have won, it scores higher."""
    higher = 0
    for seed in range(6):
        model = Hashed(seed)
        for sentence in range(10):
            for beam, alpha in ((2, 0.6), (2, 1.0), (4, 0.6), (4, 1.0)):
                beams, _ = search_one(model, sentence, beam, alpha, 9, "beams")
                bound, _ = search_one(model, sentence, beam, alpha, 9, "bound")
                assert bound.score >= beams.score - 1e-6, (seed, sentence, beam, alpha)
                higher += bound.score > beams.score + 1e-6
    assert higher


def test_the_bound_rule_with_every_output_in_the_beam_finds_the_best_scored_output_of_all():
    """With a beam as wide as every output (7 tokens other than EOS, outputs up to 3 long: 7³ live
    at most), nothing is pruned, so the rule's early end is all that could lose the best: the
    search's best must be the best of the 400 outputs, scored in float64."""
    import itertools

    limit, alpha, early = 3, 1.0, 0
    tokens = [v for v in range(Hashed.VOCAB) if v != EOS]
    for seed in range(4):
        model = Hashed(seed)

        def score(output: tuple) -> float:
            prefixes = [(0, BOS) + output[:i] for i in range(len(output) + 1)]
            log_p = sum(float(model.log_probs(p).double()[v]) for p, v in zip(prefixes, output + (EOS,)))
            return log_p / ((5 + len(output) + 1) / 6) ** alpha

        best = max(score(o) for n in range(limit + 1) for o in itertools.product(tokens, repeat=n))
        found, steps = search_one(model, 0, len(tokens) ** limit, alpha, limit, "bound")
        assert found.score == pytest.approx(best, abs=1e-5) and score(tuple(found.tokens)) == pytest.approx(best)
        early += steps < limit + 1
    assert early  # the rule did end a search before the limit


# --- Against the model -----------------------------------------------------------------------

# With attention biases (an imported Marian model's): nn.Linear draws their initial values before
# aiayn zeros them, so the random models below are those whose outputs the tests' premises were
# checked on (some end by EOS, some at the limit); without, seed 0's outputs all run to the limit.
CONFIG = ModelConfig(vocab_size=30, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, attention_bias=True)


class FullStep:
    """An uncached step function: re-runs the decoder over the whole prefix every step."""

    def __init__(self, model, src):
        self.model, self.src = model, src
        self.prefix = torch.empty(src.size(0), 0, dtype=torch.long)

    @torch.no_grad()
    def step(self, tokens):
        self.prefix = torch.cat([self.prefix, tokens.unsqueeze(1)], dim=1)
        return torch.log_softmax(self.model(self.src, self.prefix)[:, -1], dim=-1)

    def reorder(self, rows, sentences, beam):
        self.src, self.prefix = self.src[rows], self.prefix[rows]


def random_model(seed=0):
    torch.manual_seed(seed)
    model = Transformer(CONFIG).eval()
    with torch.no_grad():  # sharper distributions, and an EOS likely enough to end some outputs
        model.decoder.embed.lookup.weight.mul_(6)
        model.decoder.embed.lookup.weight[2].mul_(2)
    return model


def sources():
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 2], [13, 14, 15, 16, 2], [20, 2], [21, 22, 23, 24, 25, 26]]
    width = max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), torch.tensor([len(r) for r in rows]) + 8


@torch.no_grad()
def argmax_of_full_forward(model, src, max_len):
    """Greedy decoding at its plainest: per sentence, no padding, no cache, no search state."""
    outputs = []
    for i in range(src.size(0)):
        source = src[i : i + 1, : int((src[i] != 0).sum())]
        prefix = [1]
        while len(prefix) - 1 < max_len[i]:
            token = int(model(source, torch.tensor([prefix]))[0, -1].argmax())
            if token == 2:
                break
            prefix.append(token)
        outputs.append(prefix[1:])
    return outputs


@pytest.mark.numeric
def test_greedy_equals_the_argmax_of_the_full_forward():
    model = random_model()
    src, max_len = sources()
    s = ModelStep(model, src, int(max_len.max()) + 1)
    expected = argmax_of_full_forward(model, src, max_len)
    assert greedy(s.step, s.reorder, 1, 2, max_len) == expected
    assert any(len(e) < m for e, m in zip(expected, max_len.tolist()))  # some stop by EOS
    assert any(len(e) == m for e, m in zip(expected, max_len.tolist()))  # some at the limit


@pytest.mark.numeric
@pytest.mark.parametrize("beam", [1, 4])
def test_cached_equals_uncached(beam):
    model = random_model(1)
    src, max_len = sources()
    cached = ModelStep(model, src, int(max_len.max()) + 1)
    uncached = FullStep(model, src)
    a = beam_search(cached.step, cached.reorder, 1, 2, max_len, beam=beam)
    b = beam_search(uncached.step, uncached.reorder, 1, 2, max_len, beam=beam)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


@pytest.mark.numeric
def test_batched_equals_one_sentence_at_a_time():
    model = random_model(2)
    src, max_len = sources()
    s = ModelStep(model, src, int(max_len.max()) + 1)
    together = beam_search(s.step, s.reorder, 1, 2, max_len)
    for i in range(src.size(0)):
        length = int((src[i] != 0).sum())
        one = ModelStep(model, src[i : i + 1, :length], int(max_len[i]) + 1)
        alone = beam_search(one.step, one.reorder, 1, 2, max_len[i : i + 1])[0]
        assert alone.tokens == together[i].tokens
        assert alone.score == pytest.approx(together[i].score, abs=1e-4)


@pytest.mark.numeric
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("guards", [{}, {"no_repeat_ngram_size": 2, "repetition_penalty": 1.5}, {"stop": "bound"}])
def test_sentences_that_join_a_running_search_get_what_they_get_alone(beam, guards):
    """Continuous batching: sentences join the search at steps 0, 2 and 5, and one after the
    search has emptied; they leave as they finish. Each gets the tokens, and the alternatives, it
    gets decoded alone (§6.1), though its positions start at another column of the cache and its
    memory is padded to the longest source decoding beside it. The guards (no repeated bigram, a
    repetition penalty) read a joined sentence's own outputs, not the padding before them; so
    does tensor2tensor's stop rule (its α and limit are the sentence's own)."""
    model = random_model(2)
    ids = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21], [20], [21, 22, 23]]
    decode = dataclasses.replace(DECODE_PRESETS["translate"], beam=beam, extra_len=8, **guards)
    decoding = ContinuousDecoding(model, decode)
    pending, got, step, emptied = {0: [0, 1], 2: [2], 5: [3], 40: [4]}, {}, 0, False
    while pending or decoding.live:
        emptied |= not decoding.live and step > 0
        due = pending.pop(step, []) if decoding.live else pending.pop(min(pending))
        if due:
            decoding.join([ids[i] for i in due], due, alpha=0.6, n_best=beam)
        got.update(decoding.step())
        step += 1
    assert sorted(got) == [0, 1, 2, 3, 4] and emptied
    for i, outputs in got.items():
        one = ModelStep(model, torch.tensor([ids[i] + [2]]), len(ids[i]) + 9)
        alone = beam_search(one.step, one.reorder, 1, 2, torch.tensor([len(ids[i]) + 8]), beam=beam, n_best=beam,
                            min_len=decode.min_len, no_repeat_ngram=decode.no_repeat_ngram_size,
                            repetition_penalty=decode.repetition_penalty, stop=decode.stop)[0]
        assert outputs == [alone.tokens] + [h.tokens for h in alone.alternatives]
    assert any(len(outputs[0]) < len(ids[i]) + 8 for i, outputs in got.items())  # some end by EOS


def test_bad_beam():
    with pytest.raises(ValueError, match="beam must be at least 1"):
        beam_search(lambda t: t, lambda *a: None, 1, 2, torch.tensor([3]), beam=0)


@pytest.mark.parametrize("beam", [1, 4])
def test_min_len_bars_eos_until_reached(beam):
    """The benchmark forces every output to a fixed length with min_len = max_len."""
    model = random_model()
    src, max_len = sources()
    s = ModelStep(model, src, int(max_len.max()) + 1)
    free = [h.tokens for h in beam_search(s.step, s.reorder, 1, 2, max_len, beam=beam)]
    assert any(len(f) < m for f, m in zip(free, max_len.tolist()))
    s = ModelStep(model, src, int(max_len.max()) + 1)
    if beam == 1:
        forced = greedy(s.step, s.reorder, 1, 2, max_len, min_len=int(max_len.max()))
    else:
        forced = [h.tokens for h in beam_search(s.step, s.reorder, 1, 2, max_len, beam=beam, min_len=100)]
    assert [len(f) for f in forced] == max_len.tolist()


# --- Guards against looping outputs (off by default: §6.1's search) ----------------------------


def repeated_ngrams(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams))


def test_repeat_bans_equal_the_plain_rule():
    """Token x is banned after history h exactly when h + [x] ends in an n-gram h already holds."""
    from aiayn.search import repeat_bans

    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3):
        history = torch.randint(3, 6, (8, 9), generator=gen)  # few distinct tokens: many repeats
        match, follow = repeat_bans(history, n)
        for row in range(8):
            h = history[row].tolist()
            banned = {int(f) for f, m in zip(follow[row], match[row]) if m}
            plain = {x for x in range(6) if repeated_ngrams(h + [x], n) > repeated_ngrams(h, n)}
            assert banned == plain


@pytest.mark.parametrize("beam", [1, 4])
def test_no_repeat_ngram_leaves_no_repeated_ngram(beam):
    model = random_model(3)
    with torch.no_grad():  # EOS all but impossible: unguarded outputs run to max_len and repeat
        model.decoder.embed.lookup.weight[2].mul_(-1)
    src, max_len = sources()
    s = ModelStep(model, src, int(max_len.max()) + 1)
    free = [h.tokens for h in beam_search(s.step, s.reorder, 1, 2, max_len, beam=beam)]
    assert any(repeated_ngrams(f, 2) for f in free)
    s = ModelStep(model, src, int(max_len.max()) + 1)
    guarded = [h.tokens for h in beam_search(s.step, s.reorder, 1, 2, max_len, beam=beam, no_repeat_ngram=2)]
    assert not any(repeated_ngrams(g, 2) for g in guarded)


def test_repetition_penalty_scales_the_log_probability_of_tokens_already_output():
    table = {(): {3: 0.5, 4: 0.4, EOS: 0.1}, (3,): {3: 0.5, 5: 0.3, EOS: 0.2}, (3, 5): {EOS: 1.0}, (3, 3): {EOS: 1.0}}
    s = Scripted(table)
    assert greedy(s.step, s.reorder, BOS, EOS, torch.tensor([10])) == [[3, 3]]
    # penalty 2: log 0.5 · 2 = log 0.25 < log 0.3, so 5 follows 3; the score sums what was chosen
    s = Scripted(table)
    best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=1, alpha=0.0, repetition_penalty=2.0)[0]
    assert best.tokens == [3, 5]
    assert best.log_prob == pytest.approx(math.log(0.5 * 0.3 * 1.0), abs=1e-6)


def test_a_beam_as_wide_as_the_vocabulary_never_puts_eos_inside_an_output():
    """With k ≥ V - 1 a step can have fewer than k candidates without EOS; one picked to fill the
    beam went on decoding, and an output held EOS inside (found in review: [2, 4, 4, 4])."""
    for seed in range(4):
        torch.manual_seed(seed)
        model = Transformer(dataclasses.replace(PRESETS["tiny"], vocab_size=10)).eval()
        outputs = translate_nbest(model, [[5, 6, 7]], n_best=10, beam=10, max_output_len=4)[0]
        assert outputs and all(model.config.eos_id not in output for output in outputs), outputs


def test_a_source_past_the_learned_positions_is_refused_by_name_when_joining():
    """Found in review: ContinuousDecoding.join failed with a tensor-size RuntimeError where
    translate_ids names the limit."""
    model = Transformer(dataclasses.replace(CONFIG, positional="learned", max_len=20)).eval()
    decoding = ContinuousDecoding(model, DECODE_PRESETS["translate"])
    with pytest.raises(ValueError, match="position 25 is beyond the 20 learned positions"):
        decoding.join([[5] * 25], [0], alpha=0.6)
    assert not decoding.live
    decoding.join([[5] * 10], [0], alpha=0.6)  # one that fits decodes
    while decoding.live:
        decoding.step()


def test_a_join_that_moves_the_cache_reads_nothing_of_the_spare_storage():
    """A sentence that joins when the buffers have no room left (a reorder left room for one more
    position, and it was taken) is moved into the other storage: every row there must be
    written or zeroed (found by mutation: new rows left as the spare storage held them passed;
    only the in-place join was tested). NaN in the spare storage would reach the outputs."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                                    max_len=64)).eval()
    with torch.no_grad():
        src, later, tgt = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[15, 16, 17, 18]]), torch.randint(4, 50, (2, 5))
        memory, mask = model.encode(src)
        cache = model.init_cache(memory, mask, max_len=8)
        model.decode(tgt[:1, :2], cache=cache)
        cache.reorder(torch.tensor([0]), torch.tensor([0]), beam=1)  # room for one more position
        model.decode(tgt[:1, 2:3], cache=cache)  # taken: the join must move the buffers
        for store in cache._stores:
            store[1].fill_(float("nan"))
        later_memory, later_mask = model.encode(later)
        cache.join(model.memory_keys_values(later_memory), later_mask, rows_each=1, max_len=4)
        for t in range(2):
            step = model.decode(torch.stack([tgt[0, 3 + t], tgt[1, t]]).unsqueeze(1), cache=cache)
            torch.testing.assert_close(step[0, 0], model(src, tgt[:1, : 4 + t])[0, -1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step[1, 0], model(later, tgt[1:, : 1 + t])[0, -1], atol=1e-5, rtol=1e-5)


# --- Found in review of the bound rule ---------------------------------------------------------

ENDS_AT_ONCE = {(): {3: 0.3, 4: 0.1, EOS: 0.6}, (3,): {EOS: 0.5, 5: 0.5}, (4,): {EOS: 1.0}, (3, 5): {EOS: 1.0}}


def test_the_bound_rule_gives_n_best_outputs_where_the_beams_rule_does():
    """The empty output (P 0.6) outscores any live beam's bound at step 0, so the bound rule ends
    there with one finished hypothesis; the beams rule goes on to a second ([3], P 0.15), far from
    the limit of 10. --n-best 2 --stop bound wrote an empty second line: now the rule waits for the
    second best to be final too, and finds a better second: [3, 5] (P 0.15 over 2 tokens)."""
    found = {}
    for stop in ("beams", "bound"):
        s = Scripted(ENDS_AT_ONCE)
        h = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.6, n_best=2, stop=stop)[0]
        found[stop] = [h.tokens] + [a.tokens for a in h.alternatives]
    assert found["beams"] == [[], [3]]
    assert found["bound"] == [[], [3, 5]]


def test_the_bound_rule_refuses_a_negative_alpha():
    """beam_search and BeamSearch.join take any α; below 0 lp falls with the length, so a live
    beam's log P / lp(max_len + 1) is no upper bound of its score: the rule ended at step 0 with
    the empty output (-1.20) where [3] scores -0.68."""
    table = {(): {3: 0.65, EOS: 0.3, 4: 0.05}, (3,): {EOS: 1.0}, (4,): {EOS: 1.0}}
    s = Scripted(table)
    assert beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=-3.0)[0].tokens == [3]
    with pytest.raises(ValueError, match="the bound stop rule needs α ≥ 0, got -3.0"):
        beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=-3.0, stop="bound")


@pytest.mark.parametrize("beam", [1, 2])
def test_a_cut_sentence_finishes_at_the_next_step_with_what_it_has_output(beam):
    """A server's client that has gone: `cut` ends its sentence at the next step, as its length
    limit would, with the tokens it has output so far; the other sentence decodes on to its own
    limit. The model never gives EOS more than 1e-9, so no sentence ends of itself."""
    from aiayn.search import BeamSearch

    def step(tokens):  # tokens 3 and 4 at 0.5 each, whatever came before
        probs = torch.full((tokens.numel(), VOCAB), 1e-9)
        probs[:, 3:5] = 0.5
        return probs.log()

    search = BeamSearch(step, lambda *rows: None, BOS, EOS, torch.device("cpu"), beam, min_len=1)
    search.join(torch.tensor([20, 20]), ["gone", "stays"])
    assert [search.step() for _ in range(3)] == [[], [], []]
    assert search.cut(lambda key: key == "gone") == ["gone"]
    (key, hypothesis), = search.step()
    assert key == "gone" and len(hypothesis.tokens) == 3 and set(hypothesis.tokens) <= {3, 4}
    assert search.live == 1 and search.cut(lambda key: key == "gone") == []
    finished = [result for _ in range(17) for result in (search.step() if search.live else [])]
    assert [key for key, _ in finished] == ["stays"] and len(finished[0][1].tokens) == 20


# --- Found by mutation testing of the bound rule ------------------------------------------------

# The empty output (P 0.48, score -0.734 with α 1) ends at step 0; the live [3] (P 0.4) goes on as
# [3, 5] with certainty, and [3, 5] scores log 0.4 / lp(3) = -0.687, above it.
WINS_LATER = {(): {EOS: 0.48, 3: 0.4, 4: 0.12}, (3,): {5: 1.0}, (3, 5): {EOS: 1.0}}


@pytest.mark.parametrize("limit", [2, 10])
def test_the_bound_rule_goes_on_while_a_live_beam_can_still_win_at_its_limit(limit):
    """A live beam's bound is its log P over lp at the sentence's limit, and a hypothesis that ends
    is scored with lp(|Y| + 1): at step 0 the empty output (-0.734) is below [3]'s bound, log 0.4 /
    lp(limit + 1) (-0.687 at limit 2, -0.344 at 10), so the rule goes on and finds [3, 5] (-0.687),
    where the beams rule ends at two finished with the empty output. Found by mutation testing:
    the bound at the beam's current length (-0.785, below -0.734), or the ended output scored one
    token longer (-0.629, above -0.687 at limit 2), ended at step 0 with the empty output, and
    every test passed."""
    found = {}
    for stop in ("beams", "bound"):
        s = Scripted(WINS_LATER)
        found[stop] = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([limit]), beam=2, alpha=1.0, stop=stop)[0]
    assert found["beams"].tokens == [] and found["beams"].log_prob == pytest.approx(math.log(0.48), abs=1e-6)
    assert found["bound"].tokens == [3, 5] and found["bound"].log_prob == pytest.approx(math.log(0.4), abs=1e-6)
    assert found["bound"].score == pytest.approx(math.log(0.4) / (8 / 6), abs=1e-6)
    assert s.widths == [1, 2, 2]  # and then no live beam could win: it ends before the limit of 10


def test_greedy_stops_at_its_eos_under_either_rule():
    """Beam 1 has no beam to rank, so the bound rule leaves it alone (a server's beam-1 request
    under --stop bound, whose α is 0.6 or any other): the empty output (P 0.5) is the greedy
    output, though [3, 5] (P 0.45, -0.599 with α 1) would outscore it (-0.693). Found by mutation
    testing: the bound rule applied to beam 1 decoded on past the EOS, and every test passed (they
    decode greedy with α 0, where the finished EOS always beats a live bound)."""
    table = {(): {EOS: 0.5, 3: 0.45, 4: 0.05}, (3,): {5: 1.0}, (3, 5): {EOS: 1.0}}
    for stop in ("beams", "bound"):
        s = Scripted(table)
        best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=1, alpha=1.0, stop=stop)[0]
        assert best.tokens == [] and best.log_prob == pytest.approx(math.log(0.5), abs=1e-6), stop
        assert s.widths == [1], stop


def test_the_bound_rule_takes_an_alpha_of_zero():
    """α = 0 (lp 1: a live beam's log P bounds it) is a user's choice the rule takes, through the
    server's requests too; only a negative α is refused. TABLE's best without a length penalty is
    [3] (P 0.3) under either rule. Found by mutation testing: refusing α = 0 passed every test."""
    for stop in ("beams", "bound"):
        s = Scripted(TABLE)
        best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.0, stop=stop)[0]
        assert best.tokens == [3] and best.log_prob == pytest.approx(math.log(0.3), abs=1e-6), stop


@pytest.mark.parametrize("stop", ["beams", "bound"])
def test_a_sentence_cut_before_its_first_step_ends_there_with_fewer_outputs_than_asked(stop):
    """A sentence cut as it joins (its caller gone before its first step) has one row, so its
    limit's step ends one hypothesis, the empty output, however many outputs it asked for: it
    ends there. Found by mutation testing: the bound rule without its at-limit end waited for a
    second finished output and decoded on past the cut, and every test passed."""
    from aiayn.search import BeamSearch

    def step(tokens):  # tokens 3 and 4 at 0.5 each, whatever came before
        probs = torch.full((tokens.numel(), VOCAB), 1e-9)
        probs[:, 3:5] = 0.5
        return probs.log()

    search = BeamSearch(step, lambda *rows: None, BOS, EOS, torch.device("cpu"), 2, stop=stop)
    search.join(torch.tensor([20]), ["gone"], alpha=0.6, n_best=2)
    assert search.cut(lambda key: key == "gone") == ["gone"]
    (key, hypothesis), = search.step()
    assert key == "gone" and hypothesis.tokens == [] and hypothesis.alternatives == [] and not search.live
    assert hypothesis.log_prob == pytest.approx(math.log(1e-9), rel=1e-6)


def test_the_bound_rule_with_alternatives_counts_those_finished_at_earlier_steps():
    """With n_best 2 (α 0: a live beam's bound is its log P) the empty output (P 0.5) ends at
    step 0 and [3] (P 0.165) at step 1, when the live [4, 5] (P 0.18) could still beat it; at step
    2 nothing ends and the best live beam, [4, 5, 3] (P 0.144), can no longer beat [3]: the
    sentence ends there, after 3 steps. Found by mutation testing: the rule counting, of the
    steps before, only the best finished output waited for a second to end at a later step (one
    more step here, with the same outputs), and every test passed."""
    table = {(): {EOS: 0.5, 3: 0.3, 4: 0.2}, (3,): {EOS: 0.55, 5: 0.45}, (4,): {5: 0.9, EOS: 0.1},
             (4, 5): {3: 0.8, EOS: 0.2}, (3, 5): {3: 0.9, EOS: 0.1}}
    s = Scripted(table)
    best = beam_search(s.step, s.reorder, BOS, EOS, torch.tensor([10]), beam=2, alpha=0.0, n_best=2, stop="bound")[0]
    assert [best.tokens] + [a.tokens for a in best.alternatives] == [[], [3]]
    assert best.alternatives[0].log_prob == pytest.approx(math.log(0.3 * 0.55), abs=1e-6)
    assert s.widths == [1, 2, 2]
