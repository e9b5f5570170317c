"""aiayn.graphs: decoding over a fixed-shape state, each step one CUDA graph on a GPU. On the CPU
the static step runs without a graph and must search as aiayn.translate.ModelStep does; on a GPU
(marked `cuda`) the graph's replays must give the same outputs as the same step run without."""

import dataclasses

import pytest
import torch

from aiayn.config import PRESETS, DecodeConfig
from aiayn.graphs import WARMUP, GraphedStep, StaticCache
from aiayn.model import Transformer
from aiayn.search import beam_search
from aiayn.translate import ModelStep, padded_batch


def eos_prone_model(device: str = "cpu", positional: str = "sinusoidal") -> Transformer:
    """A random tiny model whose EOS row of the tied embedding is scaled up, so that some
    sentences end at once and others run to their limits, sources + 6 tokens: the sentences
    leave the search one by one."""
    torch.manual_seed(0)
    config = dataclasses.replace(PRESETS["tiny"], vocab_size=60, d_model=32, d_ff=64, n_heads=4, n_layers=2,
                                 positional=positional)
    model = Transformer(config).eval().to(device)
    with torch.no_grad():
        model.encoder.embed.weight[config.eos_id] *= 1.5
    return model


def search(model: Transformer, stepper: type, beam: int, n_best: int = 1, seed: int = 1, **options):
    """Beam search (greedy at beam 1) over sentences of 3-11 tokens with `stepper`'s state."""
    generator = torch.Generator().manual_seed(seed)
    sources = [torch.randint(4, 60, (length,), generator=generator).tolist() for length in (3, 11, 6, 8, 5, 9)]
    config = model.config
    src, max_len = padded_batch(config, sources, DecodeConfig(extra_len=6))
    device = next(model.parameters()).device
    with torch.inference_mode():
        state = stepper(model, src.to(device), int(max_len.max()) + 1, beam, **options)
        found = beam_search(state.step, state.reorder, config.bos_id, config.eos_id, max_len.to(device), beam,
                            n_best=n_best)
    return found, state


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_the_static_step_searches_as_the_growing_cache_does(beam, positional):
    """The same hypotheses (tokens, then log-probabilities within fp32 rounding: the static step
    sums over masked columns as well, whose weights are exactly 0) for greedy and beam search,
    with alternatives, while sentences leave at different steps; sinusoids and Table 3 row E's
    learned positions."""
    model = eos_prone_model(positional=positional)
    n_best = min(beam, 2)
    want, _ = search(model, ModelStep, beam, n_best)
    got, state = search(model, GraphedStep, beam, n_best)
    assert state.run.graph is None and state.run.steps > WARMUP  # no GPU: no graph, the same step run as it is
    lengths = {len(h.tokens) for h in want}
    assert len(lengths) > 2, lengths  # the sentences did leave one by one
    for g, w in zip(got, want):
        assert [g.tokens] + [a.tokens for a in g.alternatives] == [w.tokens] + [a.tokens for a in w.alternatives]
        assert g.log_prob == pytest.approx(w.log_prob, abs=1e-4)


def test_a_batch_of_the_same_shape_reuses_the_last_state():
    """The next batch of the same shape on the same model runs on the last batch's state (and
    would replay its graph), its source's keys and values copied in: it searches as a fresh
    state does. Another shape gets a state of its own."""
    model = eos_prone_model()
    _, first = search(model, GraphedStep, 4)
    got, again = search(model, GraphedStep, 4, seed=2)
    want, _ = search(model, ModelStep, 4, seed=2)
    assert again.run is first.run
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.log_prob for h in got] == pytest.approx([h.log_prob for h in want], abs=1e-4)
    _, other = search(model, GraphedStep, 1)
    assert other.run is not first.run


def test_a_static_state_takes_one_position_a_step_and_full_self_attention():
    """Restricted self-attention places its band around the newest column, not a static step's
    column t: such a model is refused, and `translate` decodes it with ModelStep."""
    cache = StaticCache(1, 2, 1, 4, 4, 8, torch.float32, torch.device("cpu"), [], None)
    with pytest.raises(ValueError, match="one position a step"):
        cache.positions(2)
    model = Transformer(dataclasses.replace(eos_prone_model().config, neighborhood=3)).eval()
    with pytest.raises(ValueError, match="restricted"):
        search(model, GraphedStep, 1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is false")
@pytest.mark.parametrize("beam", [1, 4])
def test_on_a_gpu_the_graph_replays_search_as_the_step_run_without_it(beam):
    """From the WARMUP-th step on, each step is one replay of the recorded graph; the outputs
    equal those of the same static step run without a graph (the same kernels, the same
    order), and ModelStep's tokens."""
    model = eos_prone_model("cuda")
    graphed, state = search(model, GraphedStep, beam)
    assert state.run.graph is not None and state.run.steps > WARMUP + 1
    replayed, again = search(model, GraphedStep, beam, seed=2)  # the same shape: the same graph, other sources
    assert again.run is state.run
    assert [h.tokens for h in replayed] == [h.tokens for h in search(model, ModelStep, beam, seed=2)[0]]
    plain, _ = search(model, GraphedStep, beam, graph=False)
    moving, _ = search(model, ModelStep, beam)
    assert [h.tokens for h in graphed] == [h.tokens for h in plain] == [h.tokens for h in moving]
    assert [h.log_prob for h in graphed] == [h.log_prob for h in plain]


def test_while_every_sentence_decodes_a_step_reads_and_moves_the_state_whole():
    """Until a sentence leaves, the live rows are every slot in order: the step writes the
    tokens and returns the log-probabilities without an index, and a reorder moves the cache
    into every slot, as moving it slot by slot does. Once a sentence has left, slots again."""
    model = eos_prone_model()
    src, max_len = padded_batch(model.config, [[5, 6, 7], [8, 9]], DecodeConfig(extra_len=6))
    with torch.inference_mode():
        state = GraphedStep(model, src, int(max_len.max()) + 1, beam=4)
        assert not state.dense  # one row a sentence before the first step
        state.step(torch.full((2,), model.config.bos_id))
        state.reorder(torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), torch.arange(2), 4)  # the first step's beams
        assert state.dense and state.slots.tolist() == list(range(8))
        assert state.step(torch.arange(4, 12)).shape == (8, model.config.vocab_size)
        cache = state.run.cache
        keys, values = cache.keys.clone(), cache.values.clone()
        parents = torch.tensor([3, 3, 0, 1, 7, 4, 4, 5])
        cache.move(parents, None, 2)
        whole = cache.keys.clone(), cache.values.clone()
        cache.keys.copy_(keys), cache.values.copy_(values)
        cache.move(parents, torch.arange(8), 2)
        assert torch.equal(whole[0], cache.keys) and torch.equal(whole[1], cache.values)
        assert torch.equal(whole[0][:, :, :, :2], keys[:, parents, :, :2])
        state.reorder(torch.tensor([4, 5, 6, 7]), torch.tensor([1]), 4)  # the first sentence has left
        assert not state.dense and state.slots.tolist() == [4, 5, 6, 7]
        assert state.step(torch.arange(4, 8)).shape == (4, model.config.vocab_size)


def test_a_static_cache_refilled_for_new_sentences_holds_no_old_keys():
    """refill zeroes every column and starts again at step 0 (found by mutation: keys and values
    left from the last batch passed, as each test's batch filled a fresh cache)."""
    keys, mask = torch.zeros(1, 1, 3, 4), torch.ones(1, 1, 1, 3, dtype=torch.bool)
    cache = StaticCache(1, 2, 1, 4, 4, 8, torch.float32, torch.device("cpu"), [(keys, keys)], mask)
    cache.keys.fill_(float("inf"))
    cache.values.fill_(float("inf"))
    cache.t += 5
    cache.refill([(keys, keys)], mask)
    assert not cache.keys.any() and not cache.values.any() and cache.t.item() == 0
