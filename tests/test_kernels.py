"""aiayn.kernels: every speed trick held to the reference math of aiayn.attention and aiayn.model."""

import copy
import dataclasses
from contextlib import nullcontext

import pytest
import torch

from aiayn import kernels, train_kernels
from aiayn.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.batching import collate
from aiayn.config import ModelConfig
from aiayn.loss import label_smoothed_nll
from aiayn.kernels import attention_mask, fused_attention, local_attention, matmul_attention, reference_math
from aiayn.inference import Int8Linear
from aiayn.model import Transformer
from aiayn.search import greedy
from aiayn.translate import ModelStep, decoding_model, translate_ids


def qkv(batch=2, heads=3, q_len=5, k_len=5, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = lambda length, d: (batch, heads, length, d)  # noqa: E731
    return (torch.randn(shape(q_len, 8), generator=generator, dtype=dtype),
            torch.randn(shape(k_len, 8), generator=generator, dtype=dtype),
            torch.randn(shape(k_len, 6), generator=generator, dtype=dtype))


def masks(q_len, k_len):
    """None, key padding, a query mask, and one whose second query sees no key at all."""
    padding = torch.ones(2, 1, 1, k_len, dtype=torch.bool)
    padding[1, ..., k_len - 2 :] = False
    per_query = torch.rand(2, 1, q_len, k_len, generator=torch.Generator().manual_seed(1)) > 0.3
    per_query[..., 0] = True
    none_seen = per_query.clone()
    none_seen[:, :, 1] = False
    return {"none": None, "padding": padding, "per-query": per_query, "a query sees nothing": none_seen}


@pytest.mark.numeric
@pytest.mark.parametrize("kernel", [fused_attention, matmul_attention], ids=["fused", "matmul"])
@pytest.mark.parametrize("mask_name", ["none", "padding", "per-query", "a query sees nothing"])
@pytest.mark.parametrize("causal, q_len, k_len", [(False, 5, 7), (True, 6, 6), (True, 2, 6)])
@pytest.mark.parametrize("grad", [True, False], ids=["training", "decoding"])
def test_kernels_equal_the_reference(kernel, mask_name, causal, q_len, k_len, grad):
    """Self- and cross-attention, causal with a cache (the queries are the newest positions), and
    a query with every key masked: zero output, as the reference (not NaN). With and without
    autograd: the matmul kernel adds its mask where a backward follows, else fills it in."""
    q, k, v = qkv(q_len=q_len, k_len=k_len)
    mask = masks(q_len, k_len)[mask_name]
    expected, _ = scaled_dot_product_attention(q, k, v, attention_mask(mask, causal, None, q_len, k_len, q.device))
    with torch.set_grad_enabled(grad):
        got = kernel(q, k, v, mask, causal, 0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    if mask_name == "a query sees nothing" and not causal:
        assert torch.equal(got[:, :, 1], torch.zeros_like(got[:, :, 1]))


@pytest.mark.numeric
@pytest.mark.parametrize("kernel", [fused_attention, matmul_attention], ids=["fused", "matmul"])
def test_kernels_in_bf16_stay_within_bf16_rounding_of_the_reference(kernel):
    """bf16 keeps 8 significant bits: each product and the softmax round at 2^-8 relative, so a
    unit-scale output lands within a few 2^-8 of the fp64 reference."""
    q, k, v = qkv(q_len=6, k_len=6, dtype=torch.float64)
    expected, _ = scaled_dot_product_attention(q, k, v, attention_mask(None, True, None, 6, 6, q.device))
    got = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, True, 0.0).double()
    torch.testing.assert_close(got, expected, rtol=0, atol=4 * 2**-8 * v.abs().max().item())


@pytest.mark.numeric
def test_local_kernel_gives_a_key_masked_row_zero_output():
    q, k, v = qkv(q_len=9, k_len=9, dtype=torch.float64)
    key_mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    key_mask[1] = False  # a sequence of padding only
    expected, _ = scaled_dot_product_attention(q, k, v, attention_mask(key_mask, False, 4, 9, 9, q.device))
    got = local_attention(q, k, v, 4, key_mask)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got[1], torch.zeros_like(got[1]))


@pytest.mark.numeric
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_restricted_attention_equals_the_reference_at_every_length_and_radius(causal):
    """The block-wise kernel of Table 1's restricted self-attention against the dense reference
    with the same band, in fp64, forward and gradients: lengths shorter than, equal to and longer
    than the band, radii 0 and 1 (one block per position), odd and even r, r beyond the length;
    key padding, and a sequence of padding only (found in review: only bf16 gradients were
    compared, at 5%)."""
    for n in (1, 2, 3, 5, 8):
        for r in (0, 1, 2, 3, 4, 7, 16):
            q, k, v = (t.requires_grad_() for t in qkv(q_len=n, k_len=n, dtype=torch.float64, seed=n * 31 + r))
            key_mask = torch.ones(2, 1, 1, n, dtype=torch.bool)
            key_mask[0, ..., n // 2 + 1:] = False
            key_mask[1] = n > 2  # a sequence of padding only, for short ones
            got = local_attention(q, k, v, r, key_mask, causal)
            grads = torch.autograd.grad(got.sum(), (q, k, v))
            expected, _ = scaled_dot_product_attention(q, k, v, attention_mask(key_mask, causal, r, n, n, q.device))
            torch.testing.assert_close(got, expected, msg=lambda m: f"n={n} r={r}: {m}")
            for grad, wanted in zip(grads, torch.autograd.grad(expected.sum(), (q, k, v))):
                torch.testing.assert_close(grad, wanted, msg=lambda m: f"n={n} r={r} gradient: {m}")


def test_restricted_attention_takes_any_radius_and_empty_inputs():
    """A radius far past the length is one block of the length (found in review: blocks of
    r // 2 padded positions; at r = 2^40 that is no allocation at all), and no sentence or no
    position gives an empty output, as the reference does, through the layer too."""
    q, k, v = qkv(q_len=6, k_len=6, dtype=torch.float64)
    expected, _ = scaled_dot_product_attention(q, k, v, attention_mask(None, False, 2**40, 6, 6, q.device))
    torch.testing.assert_close(local_attention(q, k, v, 2**40), expected)
    for batch, n in ((0, 5), (2, 0)):
        q, k, v = (torch.randn(batch, 2, n, 4, requires_grad=True) for _ in range(3))
        out = local_attention(q, k, v, 4, torch.ones(batch, 1, 1, n, dtype=torch.bool))
        assert out.shape == (batch, 2, n, 4)
        out.sum().backward()
        assert q.grad.shape == q.shape
    layer = MultiHeadAttention(8, 2, neighborhood=4)
    for batch, n in ((0, 5), (2, 0)):
        x = torch.randn(batch, n, 8)
        assert layer(x, x, x)[0].shape == (batch, n, 8)


def test_the_compiled_steps_relu_has_relus_gradient():
    """The gradient a compiled step takes from ReLU's output, g · sign(y), is ReLU's own, at 0 too
    (found in review: compared only through the bool masks a compiled step saves)."""
    x = torch.tensor([-2.0, -0.0, 0.0, 1e-30, 3.0], requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    (from_output,) = torch.autograd.grad(kernels._ReLUFromOutput.apply(x), x, g)
    (reference,) = torch.autograd.grad(torch.relu(x), x, g)
    assert torch.equal(from_output, reference)


@pytest.mark.numeric
def test_a_query_that_sees_no_key_gets_finite_fp16_gradients():
    """Found in review: the fp16 scores of a masked key, added to the dtype's lowest (-65504),
    rounded to -inf below a score of -16, and a query whose every key is masked (padding in a
    restricted window) got NaN gradients, where the reference's are finite. Scores of -40 here."""
    q, k, v = (t.half().requires_grad_() for t in qkv(q_len=4, k_len=4, dtype=torch.float64))
    with torch.no_grad():
        k.fill_(-1.0)  # every key -1, every query ≥ 14: scores ≤ -14 · 8 / √8 ≈ -40
        q.copy_(q.abs() + 14)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[:, :, 1] = False  # query 1 sees no key
    out = matmul_attention(q, k, v, mask, False, 0.0)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert torch.equal(q.grad[:, :, 1], torch.zeros_like(q.grad[:, :, 1]))  # it attends to nothing


@pytest.mark.numeric
def test_restricted_attention_with_a_mask_per_head_is_the_reference_math():
    """Found in review: a (B, h, 1, L) key mask reached the block-wise kernel, which takes one mask
    for every head, and failed; such a mask takes the reference math."""
    from aiayn.attention import MultiHeadAttention

    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2, neighborhood=4).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.rand(2, 2, 1, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[..., 0] = True
    got, _ = attention(x, x, x, mask)
    with reference_math():
        expected, _ = attention(x, x, x, mask)
    torch.testing.assert_close(got, expected)


def test_the_kernel_is_chosen_by_device_precision_grad_queries_and_neighbourhood():
    many = kernels.FEW_QUERIES + 1
    q32, k32, _ = qkv(q_len=many, k_len=many)
    q16, k16 = q32.bfloat16(), k32.bfloat16()
    step = q32[:, :, : kernels.FEW_QUERIES]  # a decoding step: the beams of each sentence
    with torch.no_grad():
        assert kernels.attention_kernel(q16, k16, None, None) is fused_attention  # inference, a whole sequence
        assert kernels.attention_kernel(step, k32, None, None) is matmul_attention
        assert kernels.attention_kernel(step.bfloat16(), k16, None, None) is matmul_attention
    with torch.enable_grad():
        assert kernels.attention_kernel(q16, k16, None, None) is matmul_attention  # bf16 CPU training
        assert kernels.attention_kernel(q32, k32, None, None) is fused_attention
        assert kernels.attention_kernel(q32, k32, None, 4) not in (None, fused_attention, matmul_attention)
        assert kernels.attention_kernel(step, k32, None, 4) is None  # a band the blocks cannot take
        with reference_math():
            assert kernels.attention_kernel(q32, k32, None, None) is None
    assert not kernels.use_reference()


TINY = ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64)


@pytest.mark.numeric
@pytest.mark.parametrize("changes", [{}, {"neighborhood": 4}, {"norm_first": True}])
def test_the_switch_turns_every_trick_off_and_changes_no_result(changes):
    """The whole model with every kernel, and under reference_math(): the same logits and, in
    bf16 training (the matmul kernel, one cast per activation), the same gradients within bf16."""
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(TINY, **changes))
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    tgt = torch.tensor([[1, 14, 15, 16, 17], [1, 18, 19, 20, 0]])
    model.eval()
    with torch.no_grad():
        fast = model(src, tgt)
        with reference_math():
            reference = model(src, tgt)
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
    model.train()
    grads = []
    for switch in (torch.enable_grad, reference_math):
        model.zero_grad()
        with switch(), torch.autocast("cpu", torch.bfloat16):
            loss = model(src, tgt).float().logsumexp(-1).mean()
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    # Each is within 16u of the fp32 gradients, u = 2^-8 (the argument of
    # test_bf16_weights_hand_the_master_gradients_within_bf16_rounding_of_fp32), so within 32u of
    # each other, normwise: a bound of bf16's rounding, not of one CPU's kernels.
    assert ((grads[0] - grads[1]).norm() / grads[1].norm()).item() < 32 * 2**-8


def test_cpu_dropout_drops_at_rate_p_and_rescales():
    """The CPU dropout draws 16 bits per element instead of a Bernoulli variable: P_drop must
    still be p (to 2^-17), the kept values scaled by 1 / (1 - p), and the gradient the same mask;
    in bf16 too, where the mask is made in bf16 and a kept value is x / (1 - p) rounded once."""
    torch.manual_seed(0)
    drop = kernels.Dropout(0.1).train()
    x = torch.ones(1000, 1000, requires_grad=True)
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002  # 1M draws: the standard error is 0.0003
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())
    assert torch.equal(drop.eval()(x), x)
    with reference_math():  # nn.Dropout's own draw: the same rate
        assert abs((drop.train()(x) == 0).float().mean().item() - 0.1) < 0.002
    low = torch.linspace(1, 2, 1_000_000).bfloat16().view(1000, 1000).requires_grad_()
    y = drop(low)
    kept = y != 0
    assert y.dtype == torch.bfloat16 and abs(1 - kept.float().mean().item() - 0.1) < 0.002
    assert torch.equal(y[kept], (low.detach() * (1 / 0.9))[kept])
    y.float().sum().backward()
    assert torch.equal(low.grad, kept.bfloat16() * torch.tensor(1 / 0.9).bfloat16())
    everything = kernels.Dropout(1.0).train()  # found in review: 1 / (1 - p) divided by zero
    assert torch.equal(everything(x), torch.zeros_like(x))
    nearly = kernels.Dropout(1 - 2**-18).train()  # found in review: its threshold wrapped, and it kept all
    assert (nearly(x) != 0).float().mean().item() < 1e-3  # P_keep 2^-18: ~4 of 1M
    inplace = kernels.Dropout(0.5, inplace=True).train()  # found in review: inplace was ignored
    z = torch.ones(1000)
    assert inplace(z) is z and abs((z == 0).float().mean().item() - 0.5) < 0.1


def test_a_compiled_training_step_saves_no_bool_mask_of_a_layer():
    """Under torch.compile, AOTAutograd saves for the backward the smallest tensors it needs, and
    for ReLU, dropout and the attention masks those were bool masks the size of a layer's
    activations, which Inductor (torch 2.13) writes and reads one element at a time on a CPU
    (aiayn.kernels.relu). The forward graph, partitioned as Inductor partitions it, must save no
    bool tensor larger than one per token (the padding masks)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    saved = []

    def forward_compiler(graph_module, example_inputs):
        outputs = next(node for node in graph_module.graph.nodes if node.op == "output").args[0]
        saved.extend(node.meta["val"] for node in outputs if isinstance(node, torch.fx.Node))
        return make_boxed_func(graph_module)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda graph_module, _: make_boxed_func(graph_module),
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(TINY, dropout=0.1)).train()
    src, tgt = torch.randint(3, 50, (4, 7)), torch.randint(3, 50, (4, 6))
    src[0, 5:] = TINY.pad_id  # padding: key masks
    with torch.autocast("cpu", torch.bfloat16):  # the matmul attention kernel of bf16 training
        torch.compile(model, backend=backend, dynamic=False)(src, tgt).float().sum().backward()
    torch._dynamo.reset()
    assert saved, "the forward graph was not captured"
    masks = [tuple(t.shape) for t in saved if t.dtype == torch.bool and t.numel() > src.numel()]
    assert not masks, masks


# --- int8 weights ------------------------------------------------------------------------------


def sharp_model(seed=0, **changes) -> Transformer:
    """A random model (TINY with `changes`) with sharper output distributions than initialisation
    gives (a trained model's logits spread over several units, a fresh one's over a fraction of one)."""
    torch.manual_seed(seed)
    model = Transformer(dataclasses.replace(TINY, **changes)).eval()
    with torch.no_grad():
        model.decoder.embed.lookup.weight.mul_(6)
    return model


def keeps_decisive_tokens(model: Transformer, copy: torch.nn.Module, share: float) -> None:
    """Where the model's best token leads the next by more than twice the largest move of that
    position's logits in `copy`, the argmax cannot change: more than `share` of the positions of
    a fixed set are such, and there `copy` picks the model's token."""
    src = torch.randint(4, 50, (16, 12), generator=torch.Generator().manual_seed(3))
    tgt = torch.cat([torch.ones(16, 1, dtype=torch.long), torch.randint(4, 50, (16, 10))], dim=1)
    with torch.no_grad():
        exact, other = model(src, tgt), copy(src, tgt)  # (16, 11, V)
    move = (other - exact).abs().amax(-1)  # (16, 11)
    top2 = exact.topk(2, dim=-1).values
    decisive = (top2[..., 0] - top2[..., 1]) > 2 * move  # (16, 11)
    assert decisive.float().mean() > share
    assert torch.equal(other.argmax(-1)[decisive], exact.argmax(-1)[decisive])


@pytest.mark.numeric
def test_an_int8_linear_layer_is_within_its_rounding_bound():
    """y = xWᵀ + b with W rounded to int8 per output row (step s_j = max|W_j| / 127.5) and x to
    at most 8 bits per call (step s_x = range(x) / 127 where the kernel keeps 7 bits): each
    product moves by at most |x_i|·s_j/2 + |W_ji|·s_x/2 + s_j·s_x/4, and so does the sum."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 48)).eval()
    x = torch.randn(10, 64) * torch.linspace(0.1, 3.0, 64)
    low = decoding_model(layer, "int8")
    s_w = layer[0].weight.abs().amax(1) / 127.5  # (48,)
    s_x = (x.max() - x.min()).clamp(min=0) / 127
    bound = x.abs().sum(1, keepdim=True) * s_w / 2 + layer[0].weight.abs().sum(1) * s_x / 2 + 64 * s_w * s_x / 4
    with torch.no_grad():
        move = (low(x) - layer(x)).abs()  # (10, 48)
    assert torch.all(move <= bound * 1.001), (move / bound).max()
    assert move.max() > 0  # it did round


@pytest.mark.numeric
def test_int8_model_quantizes_every_linear_layer_and_keeps_decisive_tokens():
    """Every linear layer (the projections, the feed-forward network, the tied pre-softmax
    projection) runs in int8; where fp32's best token leads the next by more than twice the
    largest move of that position's logits the argmax cannot change, and that is many positions
    (a third or more of the 176 checked, so that the check is not empty: the share is the random
    model's, 0.44-0.65 over four seeds with and without attention biases)."""
    model = sharp_model()
    low = decoding_model(model, "int8")
    assert decoding_model(low, "int8") is low and low is not model
    assert not any(type(m) is torch.nn.Linear for m in low.modules())
    # per layer of each stack (2 each): self-attention W^QKV (one product) and W^O; encoder-decoder
    # attention W^Q, W^KV (one product) and W^O; the two of the feed-forward network; + the projection
    assert sum(isinstance(m, Int8Linear) for m in low.modules()) == (2 + 2) * 2 + (2 + 3 + 2) * 2 + 1
    keeps_decisive_tokens(model, low, share=1 / 3)
    with reference_math():  # the reference math's copy quantizes each projection on its own (found in review)
        plain = decoding_model(model, "int8")
    attentions = [m for m in plain.modules() if isinstance(m, MultiHeadAttention)]
    assert attentions and all(a.w_qkv is None and a.w_kv is None and isinstance(a.w_k, Int8Linear) for a in attentions)


@pytest.mark.numeric
@pytest.mark.bf16
def test_int8_decoding_agrees_with_bf16_token_by_token():
    """Greedy and beam 4 over a fixed set: the share of output tokens that int8 and bf16 decoding
    agree on, position by position, stays high. Both round the same fp32 model (bf16 to 8
    significant bits, int8 to 8-bit steps); where neither rounding flips a near tie the outputs
    are the same."""
    model = sharp_model(1)
    sources = torch.randint(4, 50, (24, 9), generator=torch.Generator().manual_seed(4)).tolist()
    for beam in (1, 4):
        bf16 = translate_ids(model, sources, beam=beam, precision="bf16", extra_len=6)
        int8 = translate_ids(model, sources, beam=beam, precision="int8", extra_len=6)
        pairs = [(a, b) for x, y in zip(bf16, int8) for a, b in zip(x + [None] * len(y), y + [None] * len(x))]
        agreement = sum(a == b for a, b in pairs) / len(pairs)
        assert agreement >= 0.8, (beam, agreement)


def test_int8_is_for_cpus_and_the_search_is_unchanged():
    model = sharp_model()
    src = torch.tensor([[5, 6, 7, 2]])
    low = decoding_model(model, "int8")
    step = ModelStep(low, src, 8)
    assert step.cache.self_k[0].dtype == torch.float32  # activations stay fp32 around the int8 products
    assert len(greedy(step.step, step.reorder, 1, 2, torch.tensor([6]))[0]) <= 6
    with pytest.raises(ValueError, match="unknown precision"):
        decoding_model(model, "int4")


@pytest.mark.numeric
def test_a_beam_search_keeps_an_int8_models_cache_in_bf16_where_the_cpu_computes_bf16_fast():
    """fp32 queries against the bf16 cache: the kernel casts them and its output back, within
    bf16's rounding of the all-fp32 result; greedy search and reference_math() keep fp32."""
    model = sharp_model()
    low = decoding_model(model, "int8")
    memory = torch.randn(2, 5, TINY.d_model)
    fast_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # False under ONEDNN_MAX_CPU_ISA=AVX2
    assert kernels.cache_dtype(low, memory, beam=4) == (torch.bfloat16 if fast_bf16 else torch.float32)
    assert kernels.cache_dtype(low, memory, beam=1) == torch.float32
    assert kernels.cache_dtype(model, memory, beam=4) == torch.float32
    with reference_math():
        assert kernels.cache_dtype(low, memory, beam=4) == torch.float32
    q, k, v = qkv(q_len=4, k_len=7)
    kernel = kernels.attention_kernel(q, k.bfloat16(), None, None)
    got = kernel(q, k.bfloat16(), v.bfloat16(), None, False, 0.0)
    assert got.dtype == torch.float32
    expected, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, expected, rtol=0, atol=4 * 2**-8 * v.abs().max().item())
    # The reference math takes such a cache too: restricted self-attention's decoding steps (fewer
    # queries than keys) and attention maps (found in review: "expected scalar type Float but
    # found BFloat16" at an int8 model's second step of beam 4, with a neighbourhood).
    attention = MultiHeadAttention(d_model=24, n_heads=3, d_k=8, d_v=6, neighborhood=4).eval()
    for need_weights in (False, True):
        with torch.no_grad():
            got, _ = attention.attend(q, k.bfloat16(), v.bfloat16(), need_weights=need_weights)
            expected, _ = attention.attend(q, k, v, need_weights=need_weights)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=8 * 2**-8 * expected.abs().max().item())


@pytest.mark.numeric
def test_bf16_weights_hand_the_master_gradients_within_bf16_rounding_of_fp32():
    """Bf16Twin: the bf16 copy's forward and backward (no autocast) give the fp32 master the
    gradients of the all-fp32 model within bf16's rounding. To first order each bf16 rounding on
    a gradient's path adds at most u = 2^-8 to its relative error; a path through 2 + 2 layers,
    forward and back, passes about 16 rounded stages (activations, LayerNorms, attention,
    feed-forward, logits), so the normwise relative error stays under 16u."""
    torch.manual_seed(0)
    model = Transformer(TINY).train()
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    tgt = torch.tensor([[1, 14, 15, 16, 17], [1, 18, 19, 20, 0]])
    model(src, tgt).logsumexp(-1).mean().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    twin = train_kernels.Bf16Twin(model)
    twin.model(src, tgt).float().logsumexp(-1).mean().backward()
    twin.grads_to_master()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(p.grad is None for p in twin.model.parameters())
    got, want = torch.cat([p.grad.flatten() for p in model.parameters()]), torch.cat([g.flatten() for g in reference])
    assert ((got - want).norm() / want.norm()).item() < 16 * 2**-8


def test_bf16_weights_keep_updates_below_bf16_spacing_in_the_fp32_master():
    """Adam updates the fp32 master; the copy is the master rounded to bf16. An update far below
    bf16's spacing (2^-8 relative) leaves the copy as it was but moves the master, so many of them
    still add up, as they would in fp32."""
    torch.manual_seed(0)
    model = Transformer(TINY)
    twin = train_kernels.Bf16Twin(model)
    assert all(low.dtype == torch.bfloat16 and torch.equal(low, m.bfloat16()) for m, low in twin.pairs)
    start = [m.detach().clone() for m, _ in twin.pairs]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-6)  # Adam's first step moves a weight by ~lr
    src, tgt = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 8, 9]])
    twin.model(src, tgt).float().logsumexp(-1).mean().backward()
    twin.grads_to_master()
    pushed = [m.grad is not None and bool(m.grad.abs().max() > 0) for m, _ in twin.pairs]
    optimizer.step()
    twin.weights_from_master()
    for (m, low), before, grad in zip(twin.pairs, start, pushed):
        assert torch.equal(low, m.bfloat16())
        assert not torch.equal(m, before) if grad else torch.equal(m, before)
        if before.abs().min() > 1e-2:  # LayerNorm gains: 1e-6 is far below their bf16 spacing
            assert torch.equal(low, before.bfloat16())
    assert sum(pushed) > len(pushed) // 2


U = 2.0**-24  # fp32's unit roundoff


def within_dot_product_error(got, exact, magnitude, terms):
    """|got - exact| ≤ γ_n Σ|a_i b_i| entry by entry, γ_n = n u / (1 - n u): what any order of
    summing n fp32 products (FMA or not) can be off by (Higham, Accuracy and Stability of
    Numerical Algorithms, §3.1). exact and magnitude in float64."""
    gamma = terms * U / (1 - terms * U)
    assert ((got.double() - exact).abs() <= gamma * magnitude).all()


@pytest.mark.numeric
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_and_its_gradients_are_fp32_products(bias):
    """fp32_linears' layer: x Wᵀ + b, and the gradients g W, gᵀ x and Σ g, each entry within what
    fp32 summation of its products may be off by: oneDNN computes in IEEE fp32, as MKL does."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 70, 48, generator=generator).transpose(0, 1).requires_grad_()  # (70, 3, 48), not contiguous
    weight = torch.randn(96, 48, generator=generator, requires_grad=True)
    b = torch.randn(96, generator=generator, requires_grad=True) if bias else None
    grad = torch.randn(70, 3, 96, generator=generator)
    y = train_kernels._OneDnnLinear.apply(x, weight, b)
    y.backward(grad)
    assert y.shape == (70, 3, 96) and x.grad.shape == x.shape
    rows, w, g = x.detach().double().reshape(-1, 48), weight.detach().double(), grad.double().reshape(-1, 96)
    b64 = b.detach().double() if bias else torch.zeros(96, dtype=torch.float64)
    within_dot_product_error(y.reshape(-1, 96), rows @ w.T + b64, rows.abs() @ w.abs().T + b64.abs(), 49)
    within_dot_product_error(x.grad.reshape(-1, 48), g @ w, g.abs() @ w.abs(), 96)
    within_dot_product_error(weight.grad, g.T @ rows, g.abs().T @ rows.abs(), 210)
    if bias:
        within_dot_product_error(b.grad, g.sum(0), g.abs().sum(0), 210)


@pytest.mark.numeric
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_fp32_linears_take_every_fp32_linear_layer_and_train_as_closely_as_f_linear(monkeypatch):
    """Inside the context every linear layer of the model, the tied pre-softmax projection
    included, is the oneDNN layer, once each; a bf16 product is left to F.linear. The gradients
    are as close to float64's as F.linear's own fp32 ones: both are fp32 sums of the same
    products in other orders, under the same error bound."""
    taken = []
    original = train_kernels._OneDnnLinear.apply
    monkeypatch.setattr(train_kernels._OneDnnLinear, "apply", lambda *args: taken.append(args[1].shape) or original(*args))
    torch.manual_seed(0)
    model = Transformer(TINY).train()
    src = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    tgt = torch.tensor([[1, 14, 15, 16, 17], [1, 18, 19, 20, 0]])

    def gradients(net, mode):
        net.zero_grad(set_to_none=True)
        with mode:
            loss = net(src, tgt).logsumexp(-1).mean()
        loss.backward()
        return torch.cat([p.grad.double().flatten() for p in net.parameters()])

    exact = gradients(copy.deepcopy(model).double(), nullcontext())
    plain = gradients(model, nullcontext())
    assert taken == []
    onednn = gradients(model, train_kernels._Fp32Linears())
    linears = [m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(taken) == sorted(linears + [model.decoder.embed.weight.shape])
    # Both are fp32 sums, in their own orders, of products at most d_ff = 64 long, through about
    # 16 stages forward and back (as in the bf16 test above): within 16 × 64 fp32 roundings of
    # float64, normwise, whatever order a CPU's kernels take; a product in bf16 (2^-8 = 2^16 u
    # a rounding) would not be.
    error = lambda got: ((got - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(plain) < 16 * 64 * U and error(onednn) < 16 * 64 * U
    taken.clear()
    with train_kernels._Fp32Linears(), torch.autocast("cpu", torch.bfloat16):
        model(src, tgt)
    assert taken == []


def test_fp32_linears_only_for_fp32_on_a_cpu_whose_sgemm_runs_avx2_code(monkeypatch):
    """The oneDNN layers where MKL takes its AVX2 code (an AMD CPU with AVX-512); never for
    another precision, a GPU, a compiled step or under reference_math()."""
    cpu = torch.device("cpu")
    try:
        for kind, expected in (("amd-epyc-zen5", True), ("amd-epyc", True), ("intel-xeon", False), ("amd-epyc-avx2", False)):
            train_kernels._sgemm_at_avx2_rate.cache_clear()
            monkeypatch.setattr(train_kernels, "cpu_kind", lambda: kind)
            made = train_kernels.fp32_linears(cpu, "fp32")
            assert isinstance(made, train_kernels._Fp32Linears) == (expected and torch.backends.mkldnn.is_available())
            for device, precision, compiled in ((cpu, "bf16", False), (cpu, "fp32", True), (torch.device("cuda"), "fp32", False)):
                assert isinstance(train_kernels.fp32_linears(device, precision, compiled), nullcontext)
            with reference_math():
                assert isinstance(train_kernels.fp32_linears(cpu, "fp32"), nullcontext)
    finally:
        train_kernels._sgemm_at_avx2_rate.cache_clear()


def test_fp32_training_steps_are_deterministic_with_onednn_linears(monkeypatch):
    """Two fp32 steps of the same model on the same batches give the same losses and weights bit
    for bit with the oneDNN layers on: what an exact resume needs."""
    from aiayn.config import TrainConfig
    from aiayn.optim import make_optimizer
    from aiayn.train import TrainStep

    monkeypatch.setattr(train_kernels, "_sgemm_at_avx2_rate", lambda: True)
    taken = []
    original = train_kernels._OneDnnLinear.apply
    monkeypatch.setattr(train_kernels._OneDnnLinear, "apply", lambda *args: taken.append(1) or original(*args))
    batch = collate([([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17])], TINY.pad_id, TINY.bos_id, TINY.eos_id)
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Transformer(TINY).train()
        step = TrainStep(model, make_optimizer(model), TrainConfig(precision="fp32"), torch.device("cpu"))
        losses = torch.stack([step([batch], batch.n_tgt_tokens) for _ in range(3)])
        results.append(torch.cat([losses.flatten(), *(p.detach().flatten() for p in model.parameters())]))
    assert taken and torch.equal(results[0], results[1])


def loss_and_gradient(logits, target, epsilon, weights=(0.7, 0.3)):
    """The loss, the nll and the gradient of weights·(loss, nll) with respect to the logits."""
    logits = logits.detach().requires_grad_()
    loss, nll = label_smoothed_nll(logits, target, epsilon, pad_id=0)
    (weights[0] * loss + weights[1] * nll).backward()
    return loss.detach(), nll.detach(), logits.grad


@pytest.mark.numeric
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("weights", [(0.7, 0.3), (1.0, 0.0), (0.0, 1.0)], ids=["both", "loss", "nll"])
def test_chunked_loss_equals_autograd_through_log_softmax(monkeypatch, epsilon, weights):
    """The chunked log-softmax kernel, over chunks of 3 rows (the last one short), in fp64: the
    loss, the nll and the gradient of the reference (autograd through log_softmax)."""
    monkeypatch.setitem(kernels.CHUNK_ELEMENTS, "cpu", 3 * 11)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 11, dtype=torch.float64, generator=generator) * 4
    target = torch.randint(1, 11, (4, 5), generator=generator)
    target[0, 2:] = 0  # padding
    ours = loss_and_gradient(logits, target, epsilon, weights)
    with reference_math():
        reference = loss_and_gradient(logits, target, epsilon, weights)
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert ours[2][0, 2:].abs().max() == 0  # padding gets no gradient


@pytest.mark.numeric
def test_chunked_loss_in_bf16_stays_within_the_rounding_of_its_saved_probabilities(monkeypatch):
    """bf16 logits: the kernel keeps p in bf16 (relative error u = 2^-8) and rounds its gradient
    a·p + b once more, so each element is within u·(|a|·p + |∂|) of the exact gradient ∂, plus
    fp32's rounding. The reference token's gradient comes from the fp32 p(y): within u·|∂|."""
    monkeypatch.setitem(kernels.CHUNK_ELEMENTS, "cpu", 7 * 300)
    generator = torch.Generator().manual_seed(1)
    logits = (torch.randn(40, 300, generator=generator) * 5).bfloat16()
    # confident rows: p(y) between 0.8 and 0.97, a gradient that is a difference of two numbers near 1
    logits[:8] = (torch.randn(8, 300, generator=generator) * 0.5).bfloat16()
    logits[:8, 7] = 7.5 + 0.25 * torch.arange(8)
    target = torch.randint(1, 300, (40,), generator=generator)
    target[:8] = 7
    scale, epsilon = 1 / 37, 0.1  # the loss only, divided by a token count, as training does
    loss, nll, grad = loss_and_gradient(logits, target, epsilon, weights=(scale, 0.0))
    exact_loss, exact_nll, exact = loss_and_gradient(logits.double(), target, epsilon, weights=(scale, 0.0))
    assert grad.dtype == torch.bfloat16
    u, fp32_slack = 2.0**-8, 2.0**-20 * scale
    p = torch.softmax(logits.double(), dim=-1)
    bound = u * (scale * p + exact.abs()) + fp32_slack  # a = the loss's weight (see kernels._LogSoftmaxStats)
    assert ((grad.double() - exact).abs() <= bound).all()
    rows = torch.arange(40)
    assert ((grad.double() - exact)[rows, target].abs() <= u * exact[rows, target].abs() + fp32_slack).all()
    torch.testing.assert_close(loss.double(), exact_loss, rtol=1e-5, atol=0)  # fp32 accumulation
    torch.testing.assert_close(nll.double(), exact_nll, rtol=1e-5, atol=0)


@pytest.mark.numeric
def test_folded_beam_queries_attend_as_rows_with_copied_keys():
    """kernels.fold_queries: 3 beams of 2 sentences reading each sentence's one row of keys and
    values give what 6 rows of copied keys and values give, and unfolding restores the rows."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 2, 1, 8, generator=g)  # (B = 2 sentences × 3 beams, h, L_q, d_k)
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)  # (2, h, L_k, d)
    assert torch.equal(kernels.unfold_queries(kernels.fold_queries(q, 2), 6), q)
    folded = kernels.unfold_queries(scaled_dot_product_attention(kernels.fold_queries(q, 2), k, v)[0], 6)
    copied = scaled_dot_product_attention(q, k.repeat_interleave(3, 0), v.repeat_interleave(3, 0))[0]
    torch.testing.assert_close(folded, copied)  # fp32 defaults: the same products, summed in another order at most


def test_a_continuous_batch_keeps_its_memory_at_a_few_widths():
    """kernels.source_width: sources join padded to a multiple of 8 positions (the reference math
    pads nothing), and once the longest has left the memory is cut to the width the longest
    source still decoding needs, also a multiple of 8: the products meet few shapes. That the
    padding changes no output is test_search's joined sentences decoding as they do alone."""
    from aiayn.config import DECODE_PRESETS
    from aiayn.translate import ContinuousDecoding

    assert [kernels.source_width(n) for n in (1, 8, 9, 17)] == [8, 8, 16, 24]
    with reference_math():
        assert kernels.source_width(9) == 9
    torch.manual_seed(0)
    decoding = ContinuousDecoding(Transformer(TINY).eval(), dataclasses.replace(DECODE_PRESETS["translate"], extra_len=6))
    decoding.join([list(range(5, 25))], ["long"], alpha=0.6, max_output_len=1)  # 21 positions with EOS
    decoding.join([[5, 6]], ["short"], alpha=0.6)
    widths = {decoding.state.cache.cross[0][0].size(2)}
    while "long" not in dict(decoding.step()):
        pass
    assert decoding.live == 1
    widths.add(decoding.state.cache.cross[0][0].size(2))
    assert widths == {24, 8}
    # A model of learned positions has none past max_len: its sources are padded up to it at most.
    learned = Transformer(dataclasses.replace(TINY, positional="learned", max_len=20)).eval()
    decoding = ContinuousDecoding(learned, dataclasses.replace(DECODE_PRESETS["translate"], max_output_len=2))
    decoding.join([list(range(5, 24))], ["longest"], alpha=0.6)  # 20 positions with EOS
    assert decoding.state.cache.cross[0][0].size(2) == 20


def test_cpu_dropout_drops_exactly_round_p_of_every_16_bit_draw(monkeypatch):
    """Each element's 16 random bits are dropped below round(p · 2^16) - 2^15: given every 16-bit
    value once, exactly round(0.1 · 65536) = 6554 of 65536 elements drop (found by mutation: the
    threshold one off, P_drop moved by 2^-16, passed the statistical test's 0.002)."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int64).to(torch.int16).view(torch.int64)  # each 16-bit value once
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: every.clone())
    dropped = kernels.Dropout(0.1).train()(torch.ones(65536))
    assert int((dropped == 0).sum()) == round(0.1 * 65536)


def test_a_compiled_dropout_drops_exactly_what_the_eager_one_drops():
    """The compiled step draws from the same generator and compares as the eager step does (found
    by mutation: the compiled mask's threshold one off passed; the compiled-step tests compare
    within bf16 rounding, which a few changed elements of a million stay under)."""
    drop, x = kernels.Dropout(0.1).train(), torch.ones(1000, 1000)
    torch.manual_seed(0)
    eager = drop(x)
    torch._dynamo.reset()
    torch.manual_seed(0)
    assert torch.equal(torch.compile(drop, backend="eager", fullgraph=True)(x), eager)


def test_folded_queries_of_several_positions_attend_as_rows_with_copied_keys():
    """fold_queries with L_q > 1 (a latent path: decoding folds one query a row; found by mutation:
    (L_q, g) ordered as (g, L_q) passed)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 2, 3, 8, generator=g)  # 2 sentences × 3 beams, 2 heads, 3 queries each
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    folded = kernels.unfold_queries(scaled_dot_product_attention(kernels.fold_queries(q, 2), k, v)[0], 6)
    torch.testing.assert_close(folded, scaled_dot_product_attention(q, k.repeat_interleave(3, 0), v.repeat_interleave(3, 0))[0])


def test_bf16_weights_accumulate_the_gradients_of_two_batches_in_the_master():
    """--accumulate with --bf16-weights: each backward's bf16 gradients add to the fp32 master's
    (found by mutation: copied over them passed; no test accumulated). The same batch twice gives
    exactly twice the gradient: the bf16 gradients are the same both times, and doubling is exact."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1, dropout=0.0,
                                    max_len=64)).train()
    twin = train_kernels.Bf16Twin(model)
    src, tgt = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1, 14, 15, 16]])
    twin.model(src, tgt).float().logsumexp(-1).mean().backward()
    twin.grads_to_master()
    once = [p.grad.clone() for p in model.parameters()]
    twin.model(src, tgt).float().logsumexp(-1).mean().backward()
    twin.grads_to_master()
    for p, grad in zip(model.parameters(), once):
        torch.testing.assert_close(p.grad, 2 * grad, rtol=0, atol=0)
