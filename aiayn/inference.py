"""The model to decode with: a copy whose weights are cast, quantized or laid out once, so that no
decoding step does it again. A speed trick of aiayn.kernels' family, in a module of its own: the
weights a decoding copy holds. Inside `kernels.reference_math()` a copy is made with plain weights.

- bf16 (and fp16 on a GPU): the weights cast once, so that no step casts activations in and out
  of autocast. On a CPU that computes bf16 in hardware every linear layer is also a
  `PackedLinear`: its weight laid out once in oneDNN's blocked format.
- int8: every linear layer (W^Q, W^K, W^V, W^O, the feed-forward network and the pre-softmax
  projection) with int8 weights, one scale per output row, and activations quantized per call
  (dynamic quantization, the FBGEMM / oneDNN int8 GEMM).
"""

from __future__ import annotations

import copy
import warnings
from typing import Optional

import torch
from torch import Tensor, nn

from aiayn import kernels
from aiayn.device import DTYPES, check_precision

# The rows oneDNN lays a packed weight out for: a search's rows at a decoding step, about (a
# product of any number of rows is exact; only its speed depends on the layout).
PACKED_FOR_ROWS = 32


class PackedLinear(nn.Module):
    """x Wᵀ + b in bf16 on a CPU, W laid out in oneDNN's blocked format once. Given a plain W, as
    F.linear gives it, oneDNN lays it out anew in every call: at a decoding step's few rows that
    is a third to a half of a product's time. The same products, so the same numbers. The
    laid-out W is opaque: no copy, pickle or state dict takes it, and it lives in decoding copies
    only."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_FOR_ROWS)  # opaque
        self.register_buffer("bias", None if bias is None else bias.detach())

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) -> (..., out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def packs_bf16(weight: Tensor) -> bool:
    """Whether a bf16 copy of a model whose weights are on `weight`'s device gets `PackedLinear`s:
    on a CPU with hardware bf16 (AVX512-BF16, AMX), outside `reference_math()`."""
    return weight.device.type == "cpu" and not kernels.use_reference() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _tied_projection(model: nn.Module) -> Optional[Tensor]:
    """The embedding table that is also the pre-softmax projection (§3.4), or None if untied."""
    if not hasattr(model, "output_proj") or model.output_proj is not None:
        return None
    return (model.decoder if hasattr(model, "decoder") else model.encoder).embed.weight


def inference_copy(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with in `precision`: itself for fp32 or when it already is such a copy
    or, for bf16 and fp16 without packing, when its weights already are in it; else an eval-mode
    copy (see the module's docstring). At decoding's shapes the int8 GEMMs are 1.2-3.3× faster
    than bf16 ones on an AMD EPYC (Zen 4), where int8 weights with bf16 activations (weight-only)
    are 1.4-2.5× slower than bf16 (benchmarks/decode_kernels.py). A precision the device cannot
    run is refused (`aiayn.device.check_precision`)."""
    if precision != "int8" and precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}")
    weight = next(model.parameters())
    check_precision(weight.device, precision)
    if precision == "fp32" or getattr(model, "inference_precision", None) == precision:
        return model
    if precision == "bf16" and packs_bf16(weight):
        low = copy.deepcopy(model).to(torch.bfloat16).eval()
        for module in list(low.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, PackedLinear(child.weight, child.bias))
        if (table := _tied_projection(low)) is not None:  # the lookup keeps the table; the projection a laid-out copy
            low.output_proj = PackedLinear(table, None)
        low.inference_precision = precision
        return low
    if precision != "int8":
        return model if weight.dtype == DTYPES[precision] else copy.deepcopy(model).to(DTYPES[precision]).eval()
    low = copy.deepcopy(model).float().eval()
    if (table := _tied_projection(low)) is not None:  # a copy of the embedding to quantize
        low.output_proj = nn.Linear(table.size(1), table.size(0), bias=False)
        low.output_proj.weight = nn.Parameter(table.detach().clone())
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch 2.13 marks torch.ao as moving to torchao; the kernels are the same
        warnings.simplefilter("ignore")
        quantized = quantize_dynamic(low, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    quantized.inference_precision = precision
    return quantized
