"""The model to decode with: a copy whose weights are cast, quantized or laid out once, so that no
decoding step does it again. A speed trick of aiayn.kernels' family, in a module of its own: the
weights a decoding copy holds. Inside `kernels.reference_math()` a copy is made with plain weights.

- fp32 and bf16 on a CPU: every linear layer is a `PackedLinear`, its weight laid out once in
  oneDNN's blocked format (bf16 where the CPU computes bf16 in hardware, which is the only place
  aiayn decodes in bf16). bf16 and fp16 elsewhere (a GPU): the weights cast once, so that no step
  casts activations in and out of autocast; fp32 there decodes with the model itself.
- int8: every linear layer (W^Q, W^K, W^V, W^O, the feed-forward network and the pre-softmax
  projection) is an `Int8Linear`: int8 weights, one scale per output row, and activations
  quantized per call (dynamic quantization, FBGEMM's int8 GEMM).
- the packed (fp32, bf16) and int8 copies, outside `reference_math()`: the projections of one
  input are one product (`fuse_projections`: W^Q, W^K, W^V side by side in self-attention, W^K,
  W^V in encoder-decoder attention). The cast copies and the model itself keep separate products.
"""

from __future__ import annotations

import copy
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn import kernels
from aiayn.attention import MultiHeadAttention
from aiayn.device import DTYPES, check_precision

# The rows oneDNN lays a packed weight out for, about a search's rows at a decoding step (a
# product of any number of rows is exact; only its speed depends on the layout).
PACKED_FOR_ROWS = 32


class PackedLinear(nn.Module):
    """x Wᵀ + b on a CPU through oneDNN, W laid out in its blocked format once.

    - bf16: given a plain W, as F.linear gives it, oneDNN lays it out anew in every call; at a
      decoding step's few rows that is a third to a half of a product's time.
    - fp32: F.linear runs MKL's sgemm, which on an AMD EPYC computes at AVX2's rate; oneDNN
      computes at AVX-512's: 2.1-2.4× the FLOP/s at 256 rows of Transformer-base's shapes on a
      Zen 5, 1.0-3.4× at 4 (tests/test_inference.py holds both to F.linear's numbers).

    oneDNN compiles a kernel for every number of rows it meets and keeps it (in its kernel
    cache, aiayn.device), and decoding meets a new one at nearly every step: 200 row counts
    kept 121 MiB for one 512 -> 2,048 layer (benchmarks/decode_kernels.py). So the rows are
    padded up to `padded_rows(n)`: none below 8, from 8 up at most an eighth more.

    The laid-out W is opaque: no copy, pickle or state dict takes it (copying or pickling the
    module is refused), and it lives in decoding copies only."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_FOR_ROWS)  # opaque
        self.register_buffer("bias", None if bias is None else bias.detach().clone())  # not the model's own

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) -> (..., out_features)
        rows = x.reshape(-1, self.in_features)  # (N, in_features)
        n, padded = rows.size(0), padded_rows(rows.size(0))
        if padded != n:
            rows = F.pad(rows, (0, 0, 0, padded - n))  # (padded, in_features), the padding's rows dropped below
        return packed_product(rows, self.packed, self.bias)[:n].view(*x.shape[:-1], self.out_features)

    def __deepcopy__(self, memo):
        raise TypeError("a decoding copy's laid-out weights cannot be copied: make another copy from the model "
                        "(aiayn.inference.inference_copy)")

    def __getstate__(self):
        raise TypeError("a decoding copy's laid-out weights cannot be pickled: save the model, not its decoding copy")


# The operator's C++ entry: its Python overload (a TorchBind op, for the packed weight) first scans
# every argument for the fake script objects that only export and compile make.
_LINEAR_INT8 = torch.ops.quantized.linear_dynamic.default._op


class Int8Linear(nn.Module):
    """x Wᵀ + b with W rounded to int8 once, one scale per output row (symmetric: max |W_j| /
    127.5, as torch.ao's per-channel weight observer has it), and x quantized per call to 7 bits
    over its range (dynamic quantization: AVX2's int8 products sum pairs into int16, which 8 bits
    could overflow): FBGEMM's int8 GEMM through `quantized::linear_dynamic`.

    The same operator and packed weight as torch.ao's dynamic `Linear`, called straight: that
    module reaches it through Python (an attribute chain per call, the operator packet's checks
    for script objects), a fixed cost that is much of a product's time at a decoding step's few
    rows. The packed weight is no parameter or buffer: a state dict leaves it out (save the model,
    not its decoding copy); copying and pickling keep it (FBGEMM's object restores itself)."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float()
        # symmetric: max |W_j| is half of int8's span of 255 steps ([-128, 127]) away from 0
        scales = (weight.abs().amax(dim=1) / 127.5).clamp(min=torch.finfo(torch.float32).eps)  # (out_features,)
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch 2.13 marks quantized tensors as moving to torchao; the kernels stay
            warnings.simplefilter("ignore")
            rounded = torch.quantize_per_channel(weight, scales.double(), zero_points, 0, torch.qint8)
        bias = None if bias is None else bias.detach().float().clone()
        self.packed = torch.ops.quantized.linear_prepack(rounded, bias)  # opaque, FBGEMM's layout

    def forward(self, x: Tensor) -> Tensor:  # (..., in_features) fp32 -> (..., out_features) fp32
        return _LINEAR_INT8(x, self.packed, True)  # True: 7-bit activations (reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def packed_product(rows: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:
    """rows (N, in_features) times a laid-out weight, plus bias -> (N, out_features)."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


def padded_rows(n: int) -> int:
    """n itself below 8, else n rounded up to a number of the form k·2^j with 8 ≤ k < 16: eight
    counts per doubling, none more than an eighth above n (1, ..., 7, 8, 9, ..., 15, 16, 18, ...,
    30, 32, 36, ...). A step of one sentence has 1 (greedy) or 4 (beam 4) rows, where padding to 8
    multiplied the product's arithmetic, which on a CPU without AVX-512 bounds it as much as
    reading the weight does (docs/speed-notes.md)."""
    if n < 8:
        return n
    step = 1 << (n.bit_length() - 4)  # 2^j, with n in [8·2^j, 16·2^j)
    return -(-n // step) * step


def packs(weight: Tensor, precision: str) -> bool:
    """Whether a decoding copy in `precision` of a model whose weights are like `weight` gets
    `PackedLinear`s: fp32 or bf16 on an x86 CPU (AVX2 or newer: where it was measured) with oneDNN,
    outside `reference_math()`."""
    return (precision in ("fp32", "bf16") and weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.backends.cpu.get_cpu_capability().startswith("AVX") and not kernels.use_reference())


def _projections(model: nn.Module) -> list[tuple[MultiHeadAttention, tuple[str, ...]]]:
    """Each attention of `model` with the names of its projections of one input: W^Q, W^K, W^V
    in self-attention, W^K, W^V in encoder-decoder attention (whose query is another input)."""
    return [(a, ("w_q", "w_k", "w_v") if a.self_attention else ("w_k", "w_v"))
            for a in model.modules() if isinstance(a, MultiHeadAttention)]


def fuse_projections(model: nn.Module, low: nn.Module, make: Callable[[Tensor, Optional[Tensor]], nn.Module]) -> None:
    """Each attention of `low`, a copy of `model`, computes the projections of its one input in
    one product: self-attention its W^Q, W^K, W^V side by side (`w_qkv`), encoder-decoder
    attention its W^K, W^V (`w_kv`), made by `make(weight, bias)` from `model`'s weights; `low`
    was copied without the separate layers (`_unfused`). A decoding step has a few rows,
    where a product's fixed cost is much of its time: one sentence of Transformer-base at beam 4
    decoded 1.53× faster in int8 on an AMD EPYC (Zen 3); fp32, and 64 sentences, gained within
    that machine's spread (docs/speed-notes.md)."""
    for (ours, names), (theirs, _) in zip(_projections(model), _projections(low)):
        linears = [getattr(ours, n) for n in names]
        weight = torch.cat([layer.weight for layer in linears]).detach()  # (Σ out_features, d_model)
        bias = None if linears[0].bias is None else torch.cat([layer.bias for layer in linears]).detach()
        setattr(theirs, "w_qkv" if len(names) == 3 else "w_kv", make(weight, bias))


def _unfused(model: nn.Module) -> dict[int, None]:
    """A deepcopy memo that leaves out of the copy the layers `fuse_projections` replaces, so that
    no decoding copy holds them even for a while."""
    return {id(getattr(a, n)): None for a, names in _projections(model) for n in names}


def _tied_projection(model: nn.Module) -> Optional[Tensor]:
    """The embedding table that is also the pre-softmax projection (§3.4), or None if untied."""
    if not hasattr(model, "output_proj") or model.output_proj is not None:
        return None
    return (model.decoder if hasattr(model, "decoder") else model.encoder).embed.weight


def inference_copy(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with in `precision`: itself when it already is such a copy, or, where
    nothing is laid out, when its weights already are in `precision`; else an eval-mode copy
    (see the module's docstring). At decoding's shapes the int8 GEMMs are 1.2-3.3× faster than
    bf16 ones on an AMD EPYC (Zen 4), where int8 weights with bf16 activations (weight-only) are
    1.4-2.5× slower than bf16 (benchmarks/decode_kernels.py). A precision the device cannot run
    is refused (`aiayn.device.check_precision`)."""
    if precision != "int8" and precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}")
    weight = next(model.parameters())
    check_precision(weight.device, precision)
    made = getattr(model, "inference_precision", None)
    if made == precision:
        return model
    if made is not None:
        raise ValueError(f"this is a decoding copy in {made}; make the {precision} copy from the model itself")
    if packs(weight, precision):
        dtype = DTYPES[precision]
        make = lambda w, b: PackedLinear(w.to(dtype), None if b is None else b.to(dtype))  # noqa: E731
    elif precision == "int8":
        dtype, make = torch.float32, Int8Linear  # fp32 activations around the int8 products
    else:
        return model if weight.dtype == DTYPES[precision] else copy.deepcopy(model).to(DTYPES[precision]).eval()
    # Every linear layer made straight from the model's weights, the copy's in its place: the
    # rest of the model is copied, the linear layers' plain weights never are.
    fused = not kernels.use_reference()  # the reference math's int8 copy: a product per projection (found in review)
    memo = _unfused(model) if fused else {}
    memo |= {id(m): make(m.weight, m.bias) for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in memo}
    low = copy.deepcopy(model, memo).to(dtype).eval()
    if fused:
        fuse_projections(model, low, make)
    if (table := _tied_projection(low)) is not None:  # the lookup keeps the table; the projection its own product
        low.output_proj = make(table, None)
    low.inference_precision = precision
    return low
