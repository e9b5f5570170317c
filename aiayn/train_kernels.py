"""How the training step computes in its precision: speed tricks of aiayn.kernels' family, in a
module of their own, each held to the reference math by tests/test_kernels.py.

- `fp32_linears`: fp32 training's linear layers (W^Q, W^K, W^V, W^O, the feed-forward network,
  the pre-softmax projection) and their gradients through oneDNN's fp32 products, on an AMD CPU
  with AVX-512, where F.linear's MKL sgemm runs its AVX2 code: 1.58-1.75× the fp32 training
  tokens/s of Transformer-base on a Zen 5 (benchmarks/results/revisions-fp32-onednn-linears-amd-
  epyc-zen5.json). Off inside `kernels.reference_math()`.
- `Bf16Twin`: bf16 training with fp32 master weights (`--bf16-weights`): a bf16 copy of the model
  runs the step, the fp32 model takes Adam's update.
- `reproducible_compilation`: the compiled step (`--compile true`) made to give the eager step's
  losses from any batch it first compiles on, so that a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import copy
import functools
from contextlib import contextmanager, nullcontext
from typing import Iterator, Optional

import torch
import torch.fx.experimental._config
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from aiayn.device import cpu_kind
from aiayn.kernels import use_reference


# --------------------------------------------------------------------------------------------
# fp32 products


def _onednn(rows: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:  # (N, in) -> (N, out)
    return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")  # rows Wᵀ + b


class _OneDnnLinear(torch.autograd.Function):
    """x Wᵀ + b, and its gradients g W and gᵀ x, as oneDNN's fp32 products."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        rows = x.reshape(-1, weight.size(1))  # (N, in)
        ctx.save_for_backward(rows, weight)
        return _onednn(rows, weight, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        rows, weight = ctx.saved_tensors
        g = grad.reshape(-1, weight.size(0))  # (N, out)
        grad_x = _onednn(g, weight.t()).view(*grad.shape[:-1], weight.size(1)) if ctx.needs_input_grad[0] else None
        grad_w = _onednn(g.t(), rows.t()) if ctx.needs_input_grad[1] else None  # (out, in)
        return grad_x, grad_w, g.sum(0) if ctx.needs_input_grad[2] else None


class _Fp32Linears(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and _onednn_takes(args[0], args[1]):
            return _OneDnnLinear.apply(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"))
        return func(*args, **kwargs)


def _onednn_takes(x: Tensor, weight: Tensor) -> bool:
    """fp32 on a CPU, with a row at least (oneDNN makes no product of no rows), outside autocast
    (a mode sees the call before autocast would cast it)."""
    return (x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu" and x.numel() > 0
            and not torch.is_autocast_enabled("cpu"))


@functools.lru_cache(maxsize=None)
def _sgemm_at_avx2_rate() -> bool:
    return torch.backends.mkldnn.is_available() and cpu_kind() in ("amd-epyc", "amd-epyc-zen5")


def fp32_linears(device: torch.device, precision: str, compiled: bool = False):
    """A context in which fp32 linear layers compute through oneDNN on an AMD CPU with AVX-512,
    where MKL's sgemm, which F.linear calls, takes its AVX2 code (0.21 against oneDNN's 0.44
    TFLOP/s on a Zen 5: README, "fp32 training through oneDNN"). Elsewhere, under `reference_math()` and in a compiled step (Inductor
    cannot lower the op) it changes nothing."""
    if precision != "fp32" or device.type != "cpu" or compiled or use_reference() or not _sgemm_at_avx2_rate():
        return nullcontext()
    return _Fp32Linears()


# --------------------------------------------------------------------------------------------
# Mixed-precision training


class Bf16Twin:
    """Mixed precision with fp32 master weights, for training in bf16 (`TrainConfig.bf16_weights`).

    `model` is a copy of `master` whose weights and buffers are bf16. It runs the forward and
    backward with no autocast, so no step casts a weight, and LayerNorm, dropout, residuals and
    their gradients move half the bytes they move in fp32 (autocast keeps those in fp32). After
    the backward its gradients become the master's (in fp32), Adam updates the fp32 master,
    and the master's weights are rounded into the copy again: updates smaller than bf16's
    spacing still accumulate in the master, which checkpoints, validation and decoding use."""

    def __init__(self, master: nn.Module) -> None:
        self.master = master
        self.model = copy.deepcopy(master).to(torch.bfloat16)
        # parameters() lists a tied weight once, in the same order in both
        self.pairs = list(zip(master.parameters(), self.model.parameters()))

    def grads_to_master(self) -> None:
        """The copy's gradients, in fp32, added to the master's (accumulated batches sum in fp32);
        the copy's are released."""
        for master, low in self.pairs:
            if low.grad is not None:
                master.grad = low.grad.float() if master.grad is None else master.grad.add_(low.grad)
                low.grad = None

    @torch.no_grad()
    def weights_from_master(self) -> None:
        """The master's weights, rounded to bf16, into the copy."""
        for master, low in self.pairs:
            low.copy_(master)


# --------------------------------------------------------------------------------------------
# the compiled step


@contextmanager
def reproducible_compilation(cpu: bool = True) -> Iterator[None]:
    """While it lasts, torch.compile makes graphs whose results depend on the batch alone, so
    that a resumed run repeats the uninterrupted one bit for bit:
    - no duck shaping: sizes that happen to be equal in the batch that compiles a graph (rows =
      length, say) would become one symbol, and a later batch would compile another graph, so
      which graph serves a batch would depend on the batches before it;
    - deterministic algorithms, warn-only unless strict ones were asked for (AIAYN_DETERMINISTIC):
      Inductor then leaves the embedding's backward (an indexed accumulation) to ATen instead of
      adding with atomics from several threads, in an order that changes from run to run. On a
      GPU (not `cpu`) only if strict: warn-only keeps the fused attention's atomics there anyway,
      and would only cost Inductor its autotuning. Memory is not filled on allocation;
    - no graphs from Inductor's on-disk caches (the FX graph and AOTAutograd caches): an entry
      written by another process is served on a key that leaves out state the compiled code
      depends on (on an AMD EPYC Zen 5, torch 2.13: a graph cached by a process with other
      settings gave a first loss 3e-5 off a fresh compile's; one cached under
      ATEN_CPU_CAPABILITY=avx2 corrupted the heap of a later run without it). The C++ kernels'
      cache, keyed by their source and compiler flags, still serves;
    - and, for compiling time only, floats (dropout's p) as the graph's constants: as symbols, the
      trace would restart at a rounding that needs them (Zen 3: the tiny model's 28 s became 16 s)."""
    import torch._dynamo.config
    import torch._functorch.config
    import torch._inductor.config  # here, not at the top: it takes most of a second to import

    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.utils.deterministic.fill_uninitialized_memory)
    if cpu:  # on a GPU they stay as they were: strict where asked for, else off
        torch.use_deterministic_algorithms(True, warn_only=not previous[0] or previous[1])
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        with torch.fx.experimental._config.patch(use_duck_shape=False), \
                torch._dynamo.config.patch(specialize_float=True), \
                torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]
