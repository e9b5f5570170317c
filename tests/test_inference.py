"""aiayn.inference: the decoding copy's weights, held to the plain computation they replace."""

import copy

import pytest
import torch
import torch.nn.functional as F

from aiayn.inference import PackedLinear, inference_copy
from aiayn.kernels import reference_math
from aiayn.translate import translate_ids
from test_kernels import keeps_decisive_tokens, sharp_model

pytestmark = pytest.mark.bf16  # a copy lays out bf16 weights only on a CPU that computes bf16 in hardware

BF16_STEP = 2.0**-8  # bf16 keeps 8 significant bits: a rounding moves a number by at most half of 2^-7 of it


@pytest.mark.numeric
@pytest.mark.parametrize("rows", [(0,), (1,), (4,), (32,), (3, 37)])
def test_a_packed_linear_computes_the_plain_bf16_product(rows):
    """Both sum the same bf16 products in fp32 (in their own order) and round once to bf16: they
    differ by at most one rounding of the result, plus the fp32 sums' order, K · 2^-24 · Σ|x||w|."""
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 160).bfloat16(), torch.randn(96).bfloat16()
    x = torch.randn(*rows, 160).bfloat16()
    plain, packed = F.linear(x, weight, bias), PackedLinear(weight, bias)(x)
    assert packed.shape == plain.shape == (*rows, 96) and packed.dtype == torch.bfloat16
    magnitude = x.float().abs() @ weight.float().abs().T + bias.float().abs()  # (*rows, 96)
    bound = BF16_STEP * plain.float().abs() + 160 * 2.0**-24 * magnitude
    assert torch.all((packed.float() - plain.float()).abs() <= bound)
    assert PackedLinear(weight, None)(x).shape == plain.shape


def test_a_bf16_decoding_copy_lays_out_every_linear_layer_and_the_tied_projection():
    model = sharp_model()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    low = inference_copy(model, "bf16")
    assert not any(isinstance(m, torch.nn.Linear) for m in low.modules())
    assert sum(isinstance(m, PackedLinear) for m in low.modules()) == linears + 1  # + the pre-softmax projection
    assert low.decoder.embed.weight.dtype == torch.bfloat16  # the lookup keeps its table
    assert inference_copy(low, "bf16") is low and low is not model
    assert not any(t.is_mkldnn for t in low.state_dict().values())  # nothing opaque where a state dict looks
    with reference_math():
        plain = inference_copy(model, "bf16")
    assert not any(isinstance(m, PackedLinear) for m in plain.modules()) and plain.output_proj is None


@pytest.mark.numeric
def test_a_packed_copy_decodes_as_the_plain_bf16_copy():
    """Where the plain bf16 copy's best token leads by more than twice the largest move of that
    position's logits, the packed copy picks it too; and the searches' outputs agree."""
    model = sharp_model(1)
    plain = copy.deepcopy(model).to(torch.bfloat16).eval()
    plain.inference_precision = "bf16"  # taken as a decoding copy as it is, plain weights and all
    packed = inference_copy(model, "bf16")
    keeps_decisive_tokens(plain, packed, share=0.9)
    sources = torch.randint(4, 50, (24, 9), generator=torch.Generator().manual_seed(4)).tolist()
    for beam in (1, 4):
        outputs = [translate_ids(m, sources, beam=beam, precision="bf16", extra_len=6) for m in (plain, packed)]
        same = sum(a == b for a, b in zip(*outputs)) / len(sources)
        assert same >= 0.9, (beam, same)
