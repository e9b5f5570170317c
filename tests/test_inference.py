"""aiayn.inference: the decoding copy's weights, held to the plain computation they replace."""

import copy
import dataclasses
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

from aiayn.device import DTYPES
from aiayn import inference
from aiayn.inference import Int8Linear, PackedLinear, inference_copy, padded_rows
from aiayn.kernels import reference_math
from aiayn.model import Transformer
from aiayn.translate import translate_ids
from test_kernels import keeps_decisive_tokens, sharp_model

# A copy lays out bf16 weights only on a CPU that computes bf16 in hardware (elsewhere aiayn refuses bf16).
PRECISIONS = ["fp32", pytest.param("bf16", marks=pytest.mark.bf16)]
# Half the spacing of numbers near 1 in each format: a rounding moves a number by at most this, relatively.
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8}


@pytest.mark.numeric
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("rows", [(0,), (1,), (4,), (32,), (3, 37)])
def test_a_packed_linear_computes_what_f_linear_computes(precision, rows):
    """Both sum the same products in fp32, each in its own order, and round the sum to the
    precision once: a sum of K terms moves by at most K·u32·Σ|x||w| with the order (u32 = 2^-24),
    so the two differ by at most twice that plus one rounding of the result."""
    torch.manual_seed(0)
    dtype = DTYPES[precision]
    weight, bias = torch.randn(96, 160).to(dtype), torch.randn(96).to(dtype)
    x = torch.randn(*rows, 160).to(dtype)
    plain, packed = F.linear(x, weight, bias), PackedLinear(weight, bias)(x)
    assert packed.shape == plain.shape == (*rows, 96) and packed.dtype == dtype
    assert_within_summation_bound(packed, plain, x, weight, bias, precision)
    assert PackedLinear(weight, None)(x).shape == plain.shape


def assert_within_summation_bound(packed, plain, x, weight, bias, precision):
    magnitude = x.float().abs() @ weight.float().abs().T + (0 if bias is None else bias.float().abs())  # (..., out_features)
    bound = UNIT_ROUNDOFF[precision] * 2 * plain.float().abs() + 2 * x.size(-1) * 2.0**-24 * magnitude
    assert torch.all((packed.float() - plain.float()).abs() <= bound)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_decoding_copy_lays_out_every_linear_layer_and_the_tied_projection(precision):
    model = sharp_model()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    low = inference_copy(model, precision)
    assert not any(isinstance(m, torch.nn.Linear) for m in low.modules())
    self_attentions = sum(name.endswith("self_attn") for name, _ in model.named_modules())
    cross_attentions = sum(name.endswith("cross_attn") for name, _ in model.named_modules())
    # + the pre-softmax projection; W^Q, W^K, W^V one product in self-attention, W^K, W^V in the other
    assert sum(isinstance(m, PackedLinear) for m in low.modules()) == linears + 1 - 2 * self_attentions - cross_attentions
    assert low.decoder.embed.weight.dtype == DTYPES[precision]  # the lookup keeps its table
    assert inference_copy(low, precision) is low and low is not model and not low.training
    assert not any(t.is_mkldnn for t in low.state_dict().values())  # nothing opaque where a state dict looks
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert not any(t.untyped_storage().data_ptr() in storages for t in low.state_dict().values())  # a training step leaves it be
    with reference_math():
        plain = inference_copy(model, precision)
    assert not any(isinstance(m, PackedLinear) for m in plain.modules()) and plain.output_proj is None
    other = "int8"  # a precision every CPU decodes in (bf16 would be refused first on a CPU without it)
    with pytest.raises(ValueError, match=f"this is a decoding copy in {precision}; make the {other} copy from the model"):
        inference_copy(low, other)
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy(low)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(low)


@pytest.mark.numeric
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_packed_copy_decodes_as_the_plain_copy(precision):
    """Where the plain copy's best token leads by more than twice the largest move of that
    position's logits, the packed copy picks it too; and the searches' outputs agree."""
    model = sharp_model(1)
    plain = copy.deepcopy(model).to(DTYPES[precision]).eval()
    plain.inference_precision = precision  # taken as a decoding copy as it is, plain weights and all
    packed = inference_copy(model, precision)
    keeps_decisive_tokens(plain, packed, share=0.9)
    sources = torch.randint(4, 50, (24, 9), generator=torch.Generator().manual_seed(4)).tolist()
    for beam in (1, 4):
        outputs = [translate_ids(m, sources, beam=beam, precision=precision, extra_len=6) for m in (plain, packed)]
        same = sum(a == b for a, b in zip(*outputs)) / len(sources)
        assert same >= 0.9, (beam, same)


@pytest.mark.numeric
@pytest.mark.parametrize("precision", [*PRECISIONS, "int8"])
@pytest.mark.parametrize("head_dims", [None, (5, 7)])  # d_k = d_v = d_model / h, and Table 3 rows A/B's d_k ≠ d_v
def test_an_attentions_projections_in_one_product_are_each_projection_s_own(precision, head_dims, monkeypatch):
    """A decoding copy computes W^Q, W^K, W^V of self-attention (and W^K, W^V of the encoder-
    decoder attention) as one product of the weights side by side. Each output column is still
    its own row of the weight times the input: in int8 the same integer sums with the same scales
    as separate products, so exactly equal to them; packed fp32 and bf16 within the summation
    bound of F.linear with the model's own weight."""
    model = sharp_model()
    if head_dims is not None:
        torch.manual_seed(0)
        model = Transformer(dataclasses.replace(model.config, d_k=head_dims[0], d_v=head_dims[1])).eval()
    fused = inference_copy(model, precision)
    monkeypatch.setattr(inference, "_projections", lambda model: [])  # no attention fused
    separate = inference_copy(model, precision)
    x = torch.randn(3, 5, model.config.d_model, generator=torch.Generator().manual_seed(1))
    x = x if precision == "int8" else x.to(DTYPES[precision])  # int8 copies take fp32 activations
    stacks = zip(model.decoder.layers, fused.decoder.layers, separate.decoder.layers)
    with torch.inference_mode():
        for ours, one, each in stacks:
            assert one.self_attn.w_q is None and one.cross_attn.w_k is None and one.cross_attn.w_q is not None
            pairs = [(ours.self_attn, "w_q", "w_k", "w_v", one.self_attn.projections(x), each.self_attn.projections(x)),
                     (ours.cross_attn, "w_k", "w_v", one.cross_attn.keys_values(x, x), each.cross_attn.keys_values(x, x))]
            for attention, *names, got, separately in pairs:
                for name, heads, expected in zip(names, got, separately):
                    if precision == "int8":
                        assert torch.equal(heads, expected)
                        continue
                    layer = getattr(attention, name)
                    dtype = DTYPES[precision]
                    weight, bias, rows = layer.weight.to(dtype), None, x  # the paper's projections: no biases
                    flat = heads.transpose(1, 2).reshape(3, 5, -1)  # (B, L, h·d)
                    assert_within_summation_bound(flat, F.linear(rows, weight, bias), rows, weight, bias, precision)


@pytest.mark.parametrize("rows", [(1,), (4,), (3, 37)])
@pytest.mark.parametrize("bias", [True, False])
def test_an_int8_linear_computes_what_torch_ao_s_dynamic_linear_computes(rows, bias):
    """The same operator with the same int8 weights (one symmetric scale per output row) and the
    same 7-bit activations: equal bit for bit to the module it stands in for. Made from bf16
    weights (a bf16 model's int8 copy), it rounds those and still takes and gives fp32."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(160, 96, bias=bias)
    with torch.no_grad():
        layer.weight.mul_(torch.linspace(0.1, 4.0, 96)[:, None])  # rows of different ranges: their own scales
        layer.weight[5] = 0  # a row of zeros: the smallest step, not a division by zero
    x = torch.randn(*rows, 160) * 3
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = quantize_dynamic(torch.nn.Sequential(layer), {torch.nn.Linear: per_channel_dynamic_qconfig},
                                  dtype=torch.qint8, inplace=False)
    ours = Int8Linear(layer.weight, layer.bias)
    with torch.inference_mode():
        assert torch.equal(ours(x), theirs(x))
        assert ours(x).shape == (*rows, 96) and ours(x).dtype == torch.float32
        assert (ours(x) - layer(x)).abs().max() > 0  # it did round
        bf16 = [None if p is None else p.bfloat16() for p in (layer.weight, layer.bias)]
        rounded = Int8Linear(*(None if p is None else p.float() for p in bf16))
        assert torch.equal(Int8Linear(*bf16)(x), rounded(x)) and not torch.equal(rounded(x), ours(x))


def test_rows_are_padded_to_a_few_counts_at_most_an_eighth_more():
    """oneDNN keeps a kernel per row count: eight counts per doubling bound how many it makes,
    and the few counts below 8 (a step of one sentence) are their own."""
    counts = [padded_rows(n) for n in range(1, 1 << 14)]
    assert all(n <= padded <= n * 9 / 8 for n, padded in zip(range(1, 1 << 14), counts))
    assert [padded_rows(n) for n in range(9)] == list(range(9)) and padded_rows(257) == 288
    # 1 ... 7, then 8 counts in each [2^k, 2^(k+1)) for k = 3 ... 13, and 2^14 itself
    assert len(set(counts)) == 7 + 8 * 11 + 1


def test_a_packed_linear_computes_only_padded_row_counts(monkeypatch):
    """oneDNN gets the rows padded (a kernel per padded count, not per count), and the answer has
    the rows asked for: each row's product is its own, whatever rows are beside it."""
    seen = []
    product = inference.packed_product
    monkeypatch.setattr(inference, "packed_product", lambda rows, *rest: seen.append(rows.size(0)) or product(rows, *rest))
    weight, bias = torch.randn(24, 16), torch.randn(24)
    layer = PackedLinear(weight, bias)
    for shape in [(1, 16), (3, 16), (37, 16), (2, 5, 16)]:
        x = torch.randn(*shape)
        y = layer(x)
        assert y.shape == (*shape[:-1], 24)
        assert_within_summation_bound(y, F.linear(x, weight, bias), x, weight, bias, "fp32")
    assert seen == [1, 3, 40, 10]


@pytest.mark.numeric
@pytest.mark.parametrize("precision", [*PRECISIONS, "int8"])
def test_an_attentions_projections_in_one_product_keep_their_biases(precision, monkeypatch):
    """A fresh model's biases are zeros (aiayn.model's initialisation); a trained model's are not,
    and the product of the projections side by side adds each projection's own bias: in int8
    what separate products give (the same integer sums and scales), packed fp32 and bf16 within
    F.linear's summation bound. Found by mutation: the fused projections' biases dropped passed
    every test, whose fresh models have zero biases. (The paper's projections have none: these
    are an imported Marian model's, ModelConfig.attention_bias.)"""
    model = sharp_model(attention_bias=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 3)
    fused = inference_copy(model, precision)
    monkeypatch.setattr(inference, "_projections", lambda model: [])  # no attention fused
    separate = inference_copy(model, precision)
    x = torch.randn(3, 5, model.config.d_model, generator=torch.Generator().manual_seed(1))
    x = x if precision == "int8" else x.to(DTYPES[precision])
    with torch.inference_mode():
        for ours, one, each in zip(model.decoder.layers, fused.decoder.layers, separate.decoder.layers):
            pairs = [(ours.self_attn, ("w_q", "w_k", "w_v"), one.self_attn.projections(x), each.self_attn.projections(x)),
                     (ours.cross_attn, ("w_k", "w_v"), one.cross_attn.keys_values(x, x), each.cross_attn.keys_values(x, x))]
            for attention, names, got, separately in pairs:
                for name, heads, expected in zip(names, got, separately):
                    if precision == "int8":  # the same integer sums and scales: at most a few fp32 roundings apart
                        assert torch.allclose(heads, expected, rtol=2**-20, atol=2**-20 * expected.abs().max().item())
                        continue
                    layer, dtype = getattr(attention, name), DTYPES[precision]
                    weight, bias = layer.weight.to(dtype), layer.bias.to(dtype)
                    flat = heads.transpose(1, 2).reshape(3, 5, -1)  # (B, L, h·d)
                    assert_within_summation_bound(flat, F.linear(x, weight, bias), x, weight, bias, precision)


@pytest.mark.numeric
@pytest.mark.parametrize("precision", [*PRECISIONS, "int8"])
def test_a_decoding_copy_s_tied_projection_is_the_target_embedding(precision):
    """With separate source and target embeddings, the pre-softmax projection tied to the
    embedding (§3.4) is the target's (the decoder's) table, in every decoding copy. Found by
    mutation: the source's table passed, every other model sharing one."""
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(sharp_model().config, share_embeddings=False)).eval()
    assert model.encoder.embed is not model.decoder.embed and model.output_proj is None
    low = inference_copy(model, precision)
    h = torch.randn(7, model.config.d_model, generator=torch.Generator().manual_seed(2))
    table = model.decoder.embed.weight
    with torch.inference_mode():
        if precision == "int8":
            assert torch.equal(low.output_proj(h), Int8Linear(table, None)(h))
            return
        dtype = DTYPES[precision]
        h, table = h.to(dtype), table.to(dtype)
        zeros = torch.zeros(table.size(0), dtype=dtype)
        assert_within_summation_bound(low.output_proj(h), F.linear(h, table), h, table, zeros, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_decoding_copy_is_in_eval_mode_and_no_copy_where_nothing_changes(precision):
    """The copy is in eval mode whatever mode the model was in (dropout would make decoding
    random); under reference_math() the fp32 copy is the model itself, as it is (no second set of
    weights), the bf16 one a cast copy in eval mode. Found by mutation: neither was tested."""
    model = sharp_model().train()
    assert not inference_copy(model, precision).training
    with reference_math():
        low = inference_copy(model, precision)
        assert low is model if precision == "fp32" else not low.training
        assert next(low.parameters()).dtype == DTYPES[precision]
        assert inference_copy(model, "int8").training is False
    assert model.training  # the model's own mode untouched


def test_packed_copies_are_made_on_an_avx2_cpu(monkeypatch):
    """aiayn lays weights out for oneDNN on any x86 CPU with AVX2 or newer, not only AVX-512 ones
    (found by mutation: only `make test`'s AVX2 pass caught AVX-512 required)."""
    weight = torch.zeros(2, 2)
    if not torch.backends.mkldnn.is_available() or not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        pytest.skip("not an x86 CPU with oneDNN")
    for capability in ("AVX2", "AVX512"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        assert inference.packs(weight, "fp32")
    with reference_math():
        assert not inference.packs(weight, "fp32")
