"""Attention (§3.2) held to the lecture's worked examples and to PyTorch's own modules."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aiayn.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.kernels import attention_mask, local_attention

T = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731


def exact_attention(q, k, v):
    """softmax(QKᵀ/√d_k)V in float64 NumPy, independent of the code under test."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v, weights


# --- Scaled dot-product attention: the lecture's examples 1-3 (seeds 000 and 004) -----------


@pytest.mark.numeric
def test_example_1_three_tokens():
    q, k, v = T([[1, 0], [0, 1], [1, 1]]), T([[1, 1], [0, 1], [1, 0]]), T([[0, 2], [1, 1], [2, 0]])
    out, weights = scaled_dot_product_attention(q, k, v)
    assert torch.equal(q @ k.T, T([[1, 0, 1], [1, 1, 0], [2, 1, 1]]))  # the lecture's QKᵀ
    expected_out, expected_weights = exact_attention(q, k, v)
    np.testing.assert_allclose(weights.numpy(), expected_weights, rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), expected_out, rtol=1e-12)
    # The lecture rounds to two decimals: α ≈ [[.40 .20 .40] [.40 .40 .20] [.50 .25 .25]],
    # output ≈ [[1.00 1.00] [0.80 1.20] [0.75 1.25]].
    np.testing.assert_allclose(weights.numpy(), [[0.40, 0.20, 0.40], [0.40, 0.40, 0.20], [0.50, 0.25, 0.25]], atol=0.005)
    np.testing.assert_allclose(out.numpy(), [[1.00, 1.00], [0.80, 1.20], [0.75, 1.25]], atol=0.006)
    # Row 1 weighs the first and last value equally, so its output is exactly [1, 1].
    np.testing.assert_allclose(out[0].numpy(), [1.0, 1.0], rtol=1e-12)


@pytest.mark.numeric
def test_example_2_single_query():
    out, weights = scaled_dot_product_attention(T([[1, 1]]), T([[1, 0], [0, 1]]), T([[2, 3], [4, 1]]))
    assert torch.equal(weights, T([[0.5, 0.5]]))
    assert torch.equal(out, T([[3.0, 2.0]]))


@pytest.mark.numeric
def test_example_3_value_column():
    q = T([[1, 1, 1, 1]])
    out, weights = scaled_dot_product_attention(q, torch.eye(4, dtype=torch.float64), T([[2], [4], [6], [8]]))
    assert torch.equal(weights, T([[0.25, 0.25, 0.25, 0.25]]))
    assert torch.equal(out, T([[5.0]]))  # the in-course question's answer


# --- Multi-head attention: the two-head example with its W matrices ------------------------

Q_IN = [[1, 2, 1, 0], [0, 1, 1, 1], [1, 0, 2, 1]]
K_IN = [[1, 1, 0, 2], [2, 1, 1, 0], [0, 1, 1, 1]]
V_IN = [[1, 1, 0, 0], [0, 2, 1, 1], [1, 1, 2, 2]]
W_Q = ([[1, 0], [0, 1], [1, 0], [0, 1]], [[0, 1], [1, 0], [1, 1], [0, 0]])
W_K = ([[1, 0], [0, 1], [0, 1], [1, 0]], [[0, 1], [1, 0], [1, 0], [1, 1]])
W_V = ([[1, 0], [0, 1], [1, 0], [0, 1]], [[0, 1], [1, 1], [0, 1], [1, 0]])
W_O = [[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 1, 0], [0, 1, 0, 1]]


def two_head_module() -> MultiHeadAttention:
    """The lecture's matrices loaded into our module: W_i^Q are the columns of one projection."""
    mha = MultiHeadAttention(d_model=4, n_heads=2, bias=False).double()
    with torch.no_grad():
        # nn.Linear computes x Wᵀ, so its weight is the transpose of the paper's W (d_model × h·d_k).
        mha.w_q.weight.copy_(T(np.hstack(W_Q)).T)
        mha.w_k.weight.copy_(T(np.hstack(W_K)).T)
        mha.w_v.weight.copy_(T(np.hstack(W_V)).T)
        mha.w_o.weight.copy_(T(W_O).T)
    return mha


@pytest.mark.numeric
def test_two_head_example_exact():
    projected = {
        name: [np.asarray(x) @ np.asarray(w) for w in ws]
        for name, x, ws in (("q", Q_IN, W_Q), ("k", K_IN, W_K), ("v", V_IN, W_V))
    }
    # The integer projections are exact in both lecture versions.
    assert projected["q"][0].tolist() == [[2, 2], [1, 2], [3, 1]]
    assert projected["k"][0].tolist() == [[3, 1], [2, 2], [1, 2]]
    assert projected["v"][0].tolist() == [[1, 1], [1, 3], [3, 3]]
    assert projected["q"][1].tolist() == [[3, 2], [2, 1], [2, 3]]
    assert projected["k"][1].tolist() == [[3, 3], [2, 2], [3, 1]]
    assert projected["v"][1].tolist() == [[1, 2], [3, 3], [3, 4]]
    heads = [exact_attention(projected["q"][i], projected["k"][i], projected["v"][i]) for i in range(2)]
    expected = np.hstack([h[0] for h in heads]) @ np.asarray(W_O)

    mha = two_head_module().requires_grad_(False)
    out, weights = mha(T([Q_IN]), T([K_IN]), T([V_IN]), need_weights=True)
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-12)
    for i in range(2):
        np.testing.assert_allclose(weights[0, i].numpy(), heads[i][1], rtol=1e-12)
    fast, _ = mha(T([Q_IN]), T([K_IN]), T([V_IN]))
    np.testing.assert_allclose(fast[0].numpy(), expected, rtol=1e-12)

    # Seed 000 rounds the weights and heads to two decimals and agrees with the exact math.
    # Seed 004 prints other weights for the same scores (e.g. head 1 row 2 as [.30 .41 .30]
    # where softmax([3.54, 4.24, 3.54]) = [.25 .50 .25], and head 2 row 1 as [.46 .24 .30] where
    # the exact value is [.92 .03 .05]): those are arithmetic slips, and the exact math wins.
    np.testing.assert_allclose(weights[0, 0].numpy(), [[0.45, 0.45, 0.11], [0.25, 0.50, 0.25], [0.79, 0.19, 0.02]], atol=0.006)
    np.testing.assert_allclose(weights[0, 1].numpy(), [[0.92, 0.03, 0.05], [0.73, 0.09, 0.18], [0.96, 0.03, 0.01]], atol=0.006)
    assert not np.allclose(weights[0, 0].numpy(), [[0.43, 0.43, 0.14], [0.30, 0.41, 0.30], [0.67, 0.24, 0.09]], atol=0.02)
    # Its heads are products of those rounded weights (row 1 sums to 1.01), hence the wider margin.
    np.testing.assert_allclose(heads[0][0], [[1.23, 2.13], [1.50, 2.50], [1.04, 1.42]], atol=0.025)
    np.testing.assert_allclose(heads[1][0], [[1.16, 2.13], [1.53, 2.45], [1.09, 2.06]], atol=0.025)


# --- The fast path, masks and PyTorch's nn.MultiheadAttention ------------------------------


def padding_and_causal_mask(batch=2, heads=1, length=5, lengths=(5, 3)):
    key_ok = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return key_ok[:, None, None, :] & causal  # (B, 1, L, L)


@pytest.mark.numeric
def test_fast_path_equals_math_path():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    for mask in (None, padding_and_causal_mask(), torch.ones(5, 5, dtype=torch.bool).tril()):
        reference, _ = scaled_dot_product_attention(q, k, v, mask)
        fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(reference, fused, rtol=1e-5, atol=1e-6)
    mha = MultiHeadAttention(16, 4, d_k=8, d_v=6).eval()
    x = torch.randn(2, 5, 16)
    slow, _ = mha(x, x, x, padding_and_causal_mask(), need_weights=True)
    fast, none = mha(x, x, x, padding_and_causal_mask())
    assert none is None
    torch.testing.assert_close(slow, fast, rtol=1e-5, atol=1e-6)


@pytest.mark.numeric
def test_masked_positions_get_zero_weight():
    torch.manual_seed(1)
    mask = padding_and_causal_mask()
    _, weights = scaled_dot_product_attention(torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4), mask)
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 1, 5))
    # A query with every key masked attends to nothing: zero weights and output, not NaN.
    none = torch.zeros(1, 1, 2, 3, dtype=torch.bool)
    out, weights = scaled_dot_product_attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), none)
    assert torch.equal(weights, torch.zeros_like(weights)) and torch.equal(out, torch.zeros_like(out))


@pytest.mark.numeric
@pytest.mark.parametrize("bias", [False, True])  # §3.2.2's projections, and an imported Marian model's
def test_equals_torch_multihead_attention(bias):
    torch.manual_seed(2)
    d_model, heads = 16, 4
    ours = MultiHeadAttention(d_model, heads, bias=bias).eval()
    theirs = torch.nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        if bias:  # random, not the zeros a fresh layer starts from
            for layer in (ours.w_q, ours.w_k, ours.w_v, ours.w_o):
                layer.bias.normal_()
            theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
            theirs.out_proj.bias.copy_(ours.w_o.bias)
    query, memory = torch.randn(2, 5, d_model), torch.randn(2, 7, d_model)
    lengths = torch.tensor([7, 4])
    key_ok = torch.arange(7)[None, :] < lengths[:, None]  # (B, S), True = real token
    out, weights = ours(query, memory, memory, key_ok[:, None, None, :], need_weights=True)
    # nn.MultiheadAttention's masks have the opposite polarity: True = ignore.
    ref, ref_weights = theirs(query, memory, memory, key_padding_mask=~key_ok, average_attn_weights=False)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out, _ = ours(query, query, query, causal)
    ref, _ = theirs(query, query, query, attn_mask=~causal)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_d_k_and_d_v_are_free():
    mha = MultiHeadAttention(d_model=12, n_heads=3, d_k=5, d_v=7)
    assert mha.w_q.weight.shape == (15, 12) and mha.w_v.weight.shape == (21, 12) and mha.w_o.weight.shape == (12, 21)
    x = torch.randn(2, 4, 12)
    out, weights = mha(x, x, x, need_weights=True)
    assert out.shape == (2, 4, 12) and weights.shape == (2, 3, 4, 4)


# --- Clear errors --------------------------------------------------------------------------


def test_bad_input_gets_clear_errors():
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="share d_k"):
        scaled_dot_product_attention(torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5))
    with pytest.raises(ValueError, match="same length"):
        scaled_dot_product_attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4))
    with pytest.raises(TypeError, match="bool"):
        scaled_dot_product_attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.ones(2, 3, dtype=torch.bool))
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"\(batch, length, d_model=8\)"):
        mha(torch.randn(2, 3, 6), torch.randn(2, 3, 6), torch.randn(2, 3, 6))
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="does not broadcast"):
        mha(x, x, x, torch.ones(2, 1, 3, 4, dtype=torch.bool))


# --- Restricted self-attention (Table 1) ------------------------------------------------------


@pytest.mark.numeric
@pytest.mark.parametrize("n, r", [(1, 4), (7, 4), (16, 4), (23, 6), (30, 1), (9, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_equals_the_dense_band(n, r, causal):
    """The block-wise O(n·r) computation equals dense attention under the band mask, with
    padded keys, for lengths that do and do not fill the last block."""
    torch.manual_seed(n + r)
    q, k, v = (torch.randn(2, 3, n, 5, dtype=torch.float64) for _ in range(3))
    key_mask = torch.ones(2, 1, 1, n, dtype=torch.bool)
    key_mask[1, ..., n - n // 3 :] = False
    dense_mask = attention_mask(key_mask, causal, r, n, n, q.device)
    expected, _ = scaled_dot_product_attention(q, k, v, dense_mask)
    torch.testing.assert_close(local_attention(q, k, v, r, key_mask, causal), expected)
    band = attention_mask(None, False, r, n, n, q.device)
    assert band[0].sum() == min(n, r // 2 + 1)  # the first position sees itself and r // 2 after it


@pytest.mark.numeric
def test_local_attention_backward_matches_dense():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 13, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    local_attention(q, k, v, 4).sum().backward()
    local_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    scaled_dot_product_attention(q, k, v, attention_mask(None, False, 4, 13, 13, q.device))[0].sum().backward()
    for got, expected in zip(local_grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, expected)


def test_the_shape_checks_broadcast_as_torch_does():
    """attention._broadcast, the checks' plain-Python torch.broadcast_shapes: the same shape, or
    None where torch raises, over random shapes with sizes 0, 1 and others."""
    from aiayn.attention import _broadcast

    gen, sizes = torch.Generator().manual_seed(0), torch.tensor([0, 1, 1, 2, 3])
    draw = lambda n: int(torch.randint(0, n, (1,), generator=gen))  # noqa: E731
    outcomes = []
    for _ in range(500):
        shapes = [torch.Size(sizes[torch.randint(0, 5, (draw(4),), generator=gen)].tolist()) for _ in range(1 + draw(3))]
        try:
            expected = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            expected = None
        assert _broadcast(*shapes) == expected, shapes
        outcomes.append(expected is None)
    assert 50 < sum(outcomes) < 450  # both kinds, often
