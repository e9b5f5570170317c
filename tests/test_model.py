"""The model of §3: each component against the paper's formula, and the whole against itself
(cached = full forward, padding-invariant, save → load identical)."""

import dataclasses
import json
import math

import pytest
import torch

from aiayn import kernels
from aiayn.attention import MultiHeadAttention
from aiayn.config import ModelConfig
from aiayn.model import (
    DecoderModel,
    EncoderModel,
    FeedForward,
    Residual,
    Transformer,
    sinusoidal_positions,
)

TINY = ModelConfig(vocab_size=50, d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.0, max_len=64)


def tiny(**changes) -> Transformer:
    torch.manual_seed(0)
    return Transformer(dataclasses.replace(TINY, **changes)).eval()


def tokens(rows, pad=0, length=None):
    """Right-padded LongTensor from lists of ids."""
    length = length or max(map(len, rows))
    return torch.tensor([r + [pad] * (length - len(r)) for r in rows])


# --- Components ------------------------------------------------------------------------------


@pytest.mark.numeric
def test_feed_forward_example():
    """The lecture's FFN example: max(0, xW_1 + b_1)W_2 + b_2 = [[6, 1], [5, 1], [8, 2]]."""
    ffn = FeedForward(2, 2).double().requires_grad_(False)
    ffn.w_1.weight.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]).T)  # nn.Linear stores Wᵀ
    ffn.w_1.bias.copy_(torch.tensor([0.0, 1.0]))
    ffn.w_2.weight.copy_(torch.tensor([[1.0, 0.0], [2.0, 1.0]]).T)
    ffn.w_2.bias.copy_(torch.tensor([1.0, -1.0]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    assert torch.equal(ffn(x), torch.tensor([[6.0, 1.0], [5.0, 1.0], [8.0, 2.0]], dtype=torch.float64))
    # The ReLU is there: a negative pre-activation is cut to zero.
    assert torch.equal(ffn(torch.tensor([[-5.0, 0.0]], dtype=torch.float64)), torch.tensor([[1.0, -1.0]], dtype=torch.float64))


@pytest.mark.numeric
def test_activations_are_selectable():
    x = torch.randn(3, 8)
    for name, fn in (("gelu", torch.nn.functional.gelu), ("swish", torch.nn.functional.silu)):
        ffn = FeedForward(8, 16, name)
        torch.testing.assert_close(ffn(x), ffn.w_2(fn(ffn.w_1(x))))


@pytest.mark.numeric
def test_attention_projections_have_no_biases_as_in_section_3_2_2_but_older_models_keep_theirs(tmp_path):
    """W^Q, W^K, W^V, W^O are matrices (§3.2.2); the feed-forward network's b_1, b_2 are a layer's
    only biases. A model saved before `attention_bias` existed had biases: its config, read
    without the field, still builds them, and its weights load."""
    model = tiny()
    def attention_biases(model: Transformer) -> set[str]:
        return {name.rsplit(".", 2)[-2] for name, _ in model.named_parameters()
                if name.endswith(".bias") and ("self_attn." in name or "cross_attn." in name)}

    assert attention_biases(model) == set() and any(name.endswith("w_1.bias") for name, _ in model.named_parameters())
    old = tiny(attention_bias=True)
    assert attention_biases(old) == {"w_q", "w_k", "w_v", "w_o"}
    old.save(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["attention_bias"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = Transformer.load(tmp_path)
    assert loaded.config.attention_bias and all(torch.equal(p, q) for p, q in zip(loaded.parameters(), old.parameters()))
    assert ModelConfig.from_dict({**TINY.to_dict(), "attention_bias": False}) == TINY
    assert not [name for name, _ in MultiHeadAttention(16, 4).named_parameters() if name.endswith("bias")]
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        ModelConfig.from_dict([1, 2])


def test_sinusoidal_positions_follow_section_3_5():
    d_model = 8
    pe = sinusoidal_positions(50, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)  # even: sin
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)  # odd: cos
    # PE(pos + k) is a linear function (a rotation per sin/cos pair) of PE(pos), for any pos.
    k, i = 3, 1
    w = 1 / 10000 ** (2 * i / d_model)
    rotation = torch.tensor([[math.cos(k * w), -math.sin(k * w)], [math.sin(k * w), math.cos(k * w)]])
    for pos in (0, 10, 40):
        torch.testing.assert_close(pe[pos, 2 * i : 2 * i + 2] @ rotation, pe[pos + k, 2 * i : 2 * i + 2], atol=1e-5, rtol=0)


@pytest.mark.numeric
def test_embeddings_scaled_and_shared_with_softmax():
    model = tiny()
    assert model.encoder.embed is model.decoder.embed  # one matrix for source and target (§3.4)
    ids = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(model.encoder.embed(ids), model.encoder.embed.lookup.weight[ids] * math.sqrt(16))
    memory, mask = model.encode(ids)
    hidden, _ = model.decoder(ids, memory, mask)
    # The pre-softmax projection is the same matrix as the embeddings.
    torch.testing.assert_close(model.decode(ids, memory, mask), hidden @ model.encoder.embed.weight.T)
    names = {n for n, _ in model.named_parameters()}
    assert not any("output_proj" in n for n in names)
    unscaled = tiny(scale_embedding=False)  # Marian's switch: the lookup alone
    torch.testing.assert_close(unscaled.encoder.embed(ids), unscaled.encoder.embed.lookup.weight[ids])


def test_padding_is_never_predicted_and_its_tied_row_never_trained():
    """Padding is no word. A decoding step gives it probability 0, however high its logit (an
    imported model's bias, say), as HF's bad_words_ids and CTranslate2's vocabulary, which has
    no row for it, do. In training, the pre-softmax projection leaves its row of the shared table
    untouched, as the lookup (padding_idx) does: the row stays zero."""
    from aiayn.translate import translate_ids

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, final_logits_bias=True)
    model = Transformer(config)
    with torch.no_grad():
        model.logits_bias[config.pad_id] = 1e4
    src, tgt = torch.tensor([[5, 6, 7, config.eos_id]]), torch.tensor([[config.bos_id, 8, 9]])
    assert model(src, tgt)[0].argmax(-1).eq(config.pad_id).all()  # the logits would choose it
    for beam in (1, 3):
        out = translate_ids(model.eval(), [[5, 6, 7]], beam=beam, extra_len=5)[0]
        assert out and config.pad_id not in out
    model.train()
    with torch.no_grad():
        model.logits_bias.zero_()  # else the loss's gradient would be all on padding's logit
    model(src, tgt).logsumexp(-1).sum().backward()
    table = model.decoder.embed.weight
    assert table.grad[config.pad_id].eq(0).all() and table.grad.abs().sum() > 0


def test_untied_options_add_exactly_their_matrices():
    shared = tiny().num_parameters()
    matrix = 50 * 16
    assert tiny(share_embeddings=False).num_parameters() == shared + matrix
    assert tiny(tie_output=False).num_parameters() == shared + matrix
    assert tiny(share_embeddings=False, tie_output=False).num_parameters() == shared + 2 * matrix
    assert tiny(positional="learned").num_parameters() == shared + 2 * 64 * 16  # encoder + decoder


@pytest.mark.numeric
def test_post_norm_layer_is_layernorm_of_residual_sum():
    """LayerNorm(x + Sublayer(x)) for both sub-layers (§3.1), no final LayerNorm in post-norm."""
    model = tiny()
    layer = model.encoder.layers[0]
    x = torch.randn(2, 5, 16)
    attn, _ = layer.self_attn(x, x, x)
    y = layer.residual_attn.norm(x + attn)
    expected = layer.residual_ff.norm(y + layer.feed_forward(y))
    out, _ = layer(x, None)
    torch.testing.assert_close(out, expected)
    assert model.encoder.final_norm is None and model.decoder.final_norm is None


@pytest.mark.numeric
def test_pre_norm_option():
    model = tiny(norm_first=True)
    layer = model.encoder.layers[0]
    x = torch.randn(2, 5, 16)
    n = layer.residual_attn.norm(x)
    y = x + layer.self_attn(n, n, n)[0]
    expected = y + layer.feed_forward(layer.residual_ff.norm(y))
    torch.testing.assert_close(layer(x, None)[0], expected)
    assert model.encoder.final_norm is not None and model.decoder.final_norm is not None


def test_dropout_sits_on_embeddings_and_every_sublayer():
    """§5.4: dropout on the sum of embeddings and positions, and on each sub-layer's output."""
    model = Transformer(dataclasses.replace(TINY, dropout=0.1))
    drops = lambda m: sum(isinstance(x, torch.nn.Dropout) for x in m.modules())  # noqa: E731
    assert drops(model.encoder) == 1 + 2 * TINY.n_layers
    assert drops(model.decoder) == 1 + 3 * TINY.n_layers
    src, tgt = torch.randint(4, 50, (2, 6)), torch.randint(4, 50, (2, 5))
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))



def _dropping_all(module: torch.nn.Module, where) -> None:
    """Train mode, P_drop 1 in the Dropout modules `where` picks and 0 in every other one."""
    module.train()
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 1.0 if where(name) else 0.0


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_dropout_drops_the_sublayer_output(norm_first):
    """§5.4: "We apply dropout to the output of each sub-layer, before it is added to the sub-layer
    input and normalized". With every output dropped, what is left is the input: LayerNorm(x)
    post-norm, x itself pre-norm (found by mutation: norm(x + out) passed the count of modules)."""
    residual = Residual(dataclasses.replace(TINY, dropout=0.1, norm_first=norm_first))
    _dropping_all(residual, lambda name: True)
    x = torch.randn(2, 5, TINY.d_model)
    out, _ = residual(x, lambda h: (torch.randn_like(h) + 3.0, None))
    torch.testing.assert_close(out, x if norm_first else residual.norm(x), rtol=0, atol=0)


def test_embedding_dropout_drops_the_sum_of_embeddings_and_positions():
    """§5.4: dropout "to the sums of the embeddings and the positional encodings" of both stacks.
    With that sum dropped whole, a stack's output no longer depends on which tokens it was given;
    the rest of the model's dropout is off (found by mutation: the encoder's could be removed)."""
    model = tiny(dropout=0.1)
    _dropping_all(model, lambda name: name in ("encoder.dropout", "decoder.dropout"))
    src_a, src_b = torch.randint(4, 50, (2, 6)), torch.randint(4, 50, (2, 6))
    assert not torch.equal(src_a, src_b)
    memory_a, _ = model.encoder(src_a, None)
    memory_b, _ = model.encoder(src_b, None)
    torch.testing.assert_close(memory_a, memory_b, rtol=0, atol=0)
    tgt_a, tgt_b = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 5))
    hidden_a, _ = model.decoder(tgt_a, memory_a)
    hidden_b, _ = model.decoder(tgt_b, memory_a)
    torch.testing.assert_close(hidden_a, hidden_b, rtol=0, atol=0)
    _dropping_all(model, lambda name: False)  # the check itself can fail: tokens matter without it
    assert not torch.allclose(model.encoder(src_a, None)[0], model.encoder(src_b, None)[0])


@pytest.mark.numeric
@pytest.mark.parametrize("positional", ["sinusoidal", "sinusoidal_concat"])
def test_sinusoids_past_max_len_are_the_same_function(positional):
    """§3.5: sinusoids "may allow the model to extrapolate to sequence lengths longer than the ones
    encountered". A model of max_len 16 given 30 positions computes what a model of max_len 64
    with the same weights computes (found by mutation: the grown table's layout was not checked)."""
    short = tiny(max_len=16, positional=positional)
    long = tiny(max_len=64, positional=positional)
    long.load_state_dict(short.state_dict())
    src, tgt = torch.randint(4, 50, (2, 30)), torch.randint(4, 50, (2, 30))
    torch.testing.assert_close(short(src, tgt), long(src, tgt), rtol=0, atol=0)
    expected = sinusoidal_positions(30, TINY.d_model, concat=positional == "sinusoidal_concat")
    torch.testing.assert_close(short.encoder.positions.table[:30], expected, rtol=0, atol=0)


# --- The whole model -------------------------------------------------------------------------


@pytest.mark.numeric
def test_forward_shapes_and_padding_invariance():
    model = tiny()
    src = tokens([[5, 6, 7, 8], [9, 10]])
    tgt = tokens([[1, 11, 12], [1, 13]])
    logits = model(src, tgt)
    assert logits.shape == (2, 3, 50)
    # Extra padding changes nothing for the real positions: masks are built from pad_id.
    alone = model(torch.tensor([[9, 10]]), torch.tensor([[1, 13]]))
    torch.testing.assert_close(logits[1:, :2], alone, atol=1e-5, rtol=1e-5)
    padded_more = model(tokens([[5, 6, 7, 8]], length=9), tokens([[1, 11, 12]], length=7))
    torch.testing.assert_close(padded_more[:, :3], logits[:1], atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_restricted_self_attention_sees_only_its_neighbourhood():
    """Table 1's restricted self-attention: with r = 4 an output depends on inputs within 2
    positions per layer, so after 2 layers within 4; a wide enough r is full attention."""
    model = tiny(neighborhood=4)
    src, tgt = torch.randint(4, 50, (1, 12)), torch.randint(4, 50, (1, 3))
    memory, _ = model.encode(src)
    changed = src.clone()
    changed[0, 11] = (src[0, 11] + 1 - 4) % 46 + 4
    moved, _ = model.encode(changed)
    torch.testing.assert_close(moved[:, :7], memory[:, :7])  # more than 4 away: untouched
    assert not torch.allclose(moved[:, 7], memory[:, 7])
    wide = tiny(neighborhood=64)
    torch.testing.assert_close(wide(src, tgt), tiny()(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_decoder_is_causal_and_encoder_is_not():
    model = tiny()
    src, tgt = torch.randint(4, 50, (1, 6)), torch.randint(4, 50, (1, 5))
    changed_tgt = tgt.clone()
    changed_tgt[0, -1] = (tgt[0, -1] + 1 - 4) % 46 + 4
    a, b = model(src, tgt), model(src, changed_tgt)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])  # earlier positions cannot see the last
    assert not torch.allclose(a[:, -1], b[:, -1])
    changed_src = src.clone()
    changed_src[0, -1] = (src[0, -1] + 1 - 4) % 46 + 4
    assert not torch.allclose(model(changed_src, tgt)[:, 0], a[:, 0])  # every target sees all


@pytest.mark.parametrize(
    "changes", [{}, {"norm_first": True}, {"positional": "learned"}, {"d_k": 3, "d_v": 5}, {"neighborhood": 4}]
)
@pytest.mark.numeric
def test_cached_decoding_equals_full_forward(changes):
    model = tiny(**changes)
    src = tokens([[5, 6, 7, 8, 9], [10, 11]])
    tgt = torch.randint(4, 50, (2, 7))
    full = model(src, tgt)
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, max_len=10)
    prefix = model.decode(tgt[:, :3], cache=cache)  # several tokens at once, then one by one
    steps = [prefix] + [model.decode(tgt[:, t : t + 1], cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 7


@pytest.mark.parametrize(
    "changes", [{}, {"norm_first": True}, {"positional": "learned"}, {"d_k": 3, "d_v": 5}, {"neighborhood": 4}]
)
@pytest.mark.numeric
def test_a_sentence_that_joins_a_decoding_cache_gets_its_own_full_forward(changes):
    """Continuous batching: a sentence with a longer source joins two that have decoded 3
    positions (its positions start at column 3, its memory is padded against theirs); when the
    first two leave, the columns only they read are dropped. Every step equals the full forward
    of its row."""
    model = tiny(**changes)
    src, later = tokens([[5, 6, 7, 8, 9], [10, 11]]), tokens([[12, 13, 14, 15, 16, 17, 18, 21, 22]])
    tgt = torch.randint(4, 50, (3, 6))
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, max_len=7)
    first = model.decode(tgt[:2, :3], cache=cache)  # (2, 3, V)
    torch.testing.assert_close(first, model(src, tgt[:2, :3]), atol=1e-5, rtol=1e-5)
    new_memory, new_mask = model.encode(later)
    cache.join(model.memory_keys_values(new_memory), new_mask, rows_each=1, max_len=5)
    for t in range(2):  # rows 0 and 1 at positions 3 and 4, row 2 at 0 and 1
        step = model.decode(torch.cat([tgt[:2, 3 + t], tgt[2:, t]]).unsqueeze(1), cache=cache)  # (3, 1, V)
        torch.testing.assert_close(step[:2, 0], model(src, tgt[:2, : 4 + t])[:, -1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step[2, 0], model(later, tgt[2:, : 1 + t])[0, -1], atol=1e-5, rtol=1e-5)
    cache.reorder(torch.tensor([2]), torch.tensor([2]), beam=1)  # the first two leave
    assert cache.length == 2 and cache.start is None  # their three columns dropped
    step = model.decode(tgt[2:, 2:3], cache=cache)
    torch.testing.assert_close(step[0, 0], model(later, tgt[2:, :3])[0, -1], atol=1e-5, rtol=1e-5)
    # The short source joins; then the long one (9 positions) leaves, and the memories are cut to
    # what the short one's 2 need, at the widths a continuous batch keeps (kernels.source_width).
    short = tokens([[19, 20]])
    cache.join(model.memory_keys_values(model.encode(short)[0]), model.encode(short)[1], rows_each=1, max_len=4)
    model.decode(torch.cat([tgt[2:, 3], tgt[:1, 0]]).unsqueeze(1), cache=cache)
    cache.reorder(torch.tensor([1]), torch.tensor([1]), beam=1)
    width = kernels.source_width(2)
    assert width < 9 and cache.memory_mask.shape == (1, 1, 1, width) and cache.cross[0][0].size(2) == width
    step = model.decode(tgt[:1, 1:2], cache=cache)
    torch.testing.assert_close(step[0, 0], model(short, tgt[:1, :2])[0, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_a_join_into_the_room_of_sentences_that_left_copies_nothing_and_reads_nothing_stale():
    """Once sentences have left, a buffer's storage has room for the rows of those that join:
    the rows are added in place (the keys already written stay where they are, not copied), and
    what that room held before (NaN here) is never read."""
    with torch.no_grad():  # as decoding runs: a cache that records gradients is always copied
        model = tiny()
        src, later = tokens([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]), tokens([[15, 16, 17, 18]])
        tgt = torch.randint(4, 50, (2, 4))
        memory, mask = model.encode(src)
        cache = model.init_cache(memory, mask, max_len=8)
        model.decode(torch.cat([tgt[:1, :2], tgt[:1, :2], tgt[:1, :2]]), cache=cache)
        cache.reorder(torch.tensor([0]), torch.tensor([0]), beam=1)  # two of the three leave
        for buffer, (storage, _) in zip(cache._buffers, cache._stores):
            storage[buffer.numel():] = float("nan")
        written = [buffer.data_ptr() for buffer in cache._buffers]
        cache.join(model.memory_keys_values(model.encode(later)[0]), model.encode(later)[1], rows_each=1, max_len=4)
        assert [buffer.data_ptr() for buffer in cache._buffers] == written  # in place
        for t in range(2):  # row 0 at positions 2 and 3, the new row at 0 and 1
            step = model.decode(torch.stack([tgt[0, 2 + t], tgt[1, t]]).unsqueeze(1), cache=cache)  # (2, 1, V)
            torch.testing.assert_close(step[0, 0], model(src[:1], tgt[:1, : 3 + t])[0, -1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step[1, 0], model(later, tgt[1:, : 1 + t])[0, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.numeric
def test_cache_reorder_follows_the_rows():
    """As a beam search of beam 2 uses it: widen each sentence to its beams, let a sentence
    leave, move beams within sentences; every step equals the full forward of its row."""
    model = tiny()
    src = tokens([[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]])
    tgt = torch.randint(4, 50, (6, 5))
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, max_len=8)
    model.decode(tgt[::2, :2], cache=cache)  # one row per sentence
    cache.reorder(torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 2]), beam=2)
    rows = torch.tensor([0, 1, 2, 3, 4, 5])  # the sentence of each row: 0 0 1 1 2 2
    prefix = tgt[::2, :2].repeat_interleave(2, dim=0)  # (6, 2)
    for t, (kept_rows, sentences) in enumerate([([0, 0, 4, 5], [0, 2]), ([1, 0, 3, 3], [0, 1])], start=2):
        prefix = torch.cat([prefix, tgt[: prefix.size(0), t : t + 1]], dim=1)
        step = model.decode(prefix[:, -1:], cache=cache)
        full = model(src[rows // 2], prefix)
        torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)
        kept, sentences = torch.tensor(kept_rows), torch.tensor(sentences)
        cache.reorder(kept, sentences, beam=2)
        rows, prefix = rows[kept], prefix[kept]
    with pytest.raises(ValueError, match="3 rows are not 2 sentences × beam 2"):
        cache.reorder(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), beam=2)


@pytest.mark.numeric
def test_attention_maps_shapes_and_rows_sum_to_one():
    model = tiny()
    src, tgt = tokens([[5, 6, 7], [8, 9]]), tokens([[1, 4], [1, 5]])
    maps = model.attention_maps(src, tgt)
    assert [m.shape for m in maps["encoder"]] == [(2, 4, 3, 3)] * 2
    assert [m.shape for m in maps["decoder"]] == [(2, 4, 2, 2)] * 2
    assert [m.shape for m in maps["cross"]] == [(2, 4, 2, 3)] * 2
    assert torch.all(maps["cross"][0][1, :, :, 2] == 0)  # padding in sentence 2 gets no weight
    torch.testing.assert_close(maps["encoder"][1].sum(-1), torch.ones(2, 4, 3))


@pytest.mark.numeric
def test_encoder_only_and_decoder_only_families():
    torch.manual_seed(0)
    encoder = EncoderModel(TINY).eval()
    decoder = DecoderModel(TINY).eval()
    x = torch.randint(4, 50, (2, 6))
    assert encoder(x).shape == (2, 6, 50) and encoder.encode(x).shape == (2, 6, 16)
    assert all(layer.cross_attn is None for layer in decoder.decoder.layers)
    full = decoder(x)
    cache = decoder.init_cache(batch=2, max_len=6)
    steps = torch.cat([decoder(x[:, t : t + 1], cache=cache) for t in range(6)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cls", [Transformer, EncoderModel, DecoderModel])
def test_save_then_load_gives_identical_outputs(tmp_path, cls):
    torch.manual_seed(0)
    config = dataclasses.replace(TINY, positional="learned", tie_output=cls is not Transformer)
    model = cls(config).eval()
    model.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = cls.load(tmp_path / "m").eval()
    assert loaded.config == config
    x = torch.randint(4, 50, (2, 5))
    args = (x, x[:, :3]) if cls is Transformer else (x,)
    assert torch.equal(model(*args), loaded(*args))


@pytest.mark.parametrize("changes", [{}, {"positional": "learned", "tie_output": False}, {"positional": "sinusoidal_concat"},
                                     {"share_embeddings": False, "final_logits_bias": True, "norm_first": True}])
@pytest.mark.parametrize("cls", [Transformer, EncoderModel, DecoderModel])
def test_a_model_on_the_meta_device_has_the_real_ones_tensors(cls, changes):
    """aiayn.checkpoint.meta_model, which sizes a model before it is built, skips the filling of
    tensors on the meta device: every parameter and buffer still has the real model's name,
    shape and dtype, and a fixed buffer (the sinusoids) is on the meta device with the rest."""
    from aiayn.checkpoint import meta_model

    config = dataclasses.replace(TINY, **changes)
    shapes, real = meta_model(cls, config), cls(config)
    described = lambda model: {name: (tuple(t.shape), t.dtype) for name, t in  # noqa: E731
                               [*model.named_parameters(), *model.named_buffers()]}
    assert described(shapes) == described(real)
    assert {t.device.type for t in [*shapes.parameters(), *shapes.buffers()]} == {"meta"}


def test_loading_a_model_imports_no_dynamo(tmp_path):
    """A command that loads a model (translate, average, serve) is not made to import Dynamo,
    about 2 of its 6 seconds on a slow CPU, by building the model on the meta device first: PyTorch
    runs operations on meta tensors through its Python references, whose first call imports it."""
    import subprocess
    import sys

    tiny().save(tmp_path)
    code = ("import sys; from aiayn.model import Transformer; Transformer.load(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an aiayn model folder"):
        Transformer.load(tmp_path)
    tiny().save(tmp_path)
    with pytest.raises(ValueError, match="holds a 'Transformer', not a DecoderModel"):
        DecoderModel.load(tmp_path)
    (tmp_path / "config.json").write_text('{"d_model": 32, "vocab_size": 50, "n_heads": 4}')
    with pytest.raises(ValueError, match="does not match its config.json"):
        Transformer.load(tmp_path)
    (tmp_path / "config.json").write_text('{"d_modle": 32}')
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        Transformer.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Transformer.load(tmp_path)


def test_bad_tokens_get_clear_errors():
    model = tiny()
    ok = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="LongTensor of shape"):
        model(ok.float(), ok)
    with pytest.raises(ValueError, match="LongTensor of shape"):
        model(torch.tensor([5, 6]), ok)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[5, 60]]), ok)
    with pytest.raises(ValueError, match="batch sizes differ"):
        model(ok, torch.tensor([[1], [1]]))
    with pytest.raises(ValueError, match="empty"):
        model(torch.zeros(1, 0, dtype=torch.long), ok)
    learned = tiny(positional="learned")
    with pytest.raises(ValueError, match="learned positions"):
        learned(torch.randint(4, 50, (1, 70)), ok)
