"""How the paper's math is computed fast: the one place for speed tricks.

aiayn.attention and aiayn.model state the math of §3 as the paper writes it; this module decides
how a CPU or a GPU computes it, and tests/test_kernels.py holds every choice equal to the
reference math:

- `attention_kernel` picks, once per attention call, one of three kernels with one signature
  (queries, keys, values, key mask, causal, dropout) -> heads:
    fused    PyTorch's `scaled_dot_product_attention` (flash / memory-efficient / math; on a
             GPU never cuDNN's, which plans anew for every new shape: `GPU_SDPA_BACKENDS`);
    matmul   two matrix products and an fp32 softmax: on a CPU, for bf16 training, where the
             fused kernel's backward is several times slower (benchmarks/), and for the few
             queries of a decoding step, where it is 2-5× faster than the fused one;
    local    restricted self-attention (Table 1) in blocks, O(n·r) instead of O(n²).
  Every kernel gives a query whose keys are all masked a zero output, as the reference does.
- `Dropout`: dropout from 16-bit random draws on a CPU, where one Bernoulli draw per element is
  the largest cost of a training step after the matrix products.
- `relu`, and the masks of `Dropout` and `matmul_attention`, keep a compiled training step free
  of bool tensors, which Inductor writes and reads one element at a time on a CPU.
- `autocast_input` and `cache_dtype`: under autocast, cast an activation once, not once per
  projection; keep the decoder's keys and values in the precision they are computed in (bf16
  for an int8 model on a CPU that computes bf16 fast).
- `log_softmax_stats`: the per-token statistics the loss of §5.4 needs, -log p(y) and Σ_k log p(k),
  computed over a few rows at a time, so that no (tokens × vocabulary) tensor wider than the
  logits' own dtype is built (with bf16 logits, none in fp32): one fp32 such tensor is 32 MB at
  the demo's shape and 3.7 GB at the paper's (25,000 tokens × 37,000).
- `source_width`: a server pads the sources that join a running search, and the encoder-decoder
  memory it keeps, to a multiple of 8 positions, so that oneDNN meets a few problem shapes again
  rather than compiling a kernel for every new source length.
- `fold_queries`: the beams of a sentence attend to its one copy of the encoder-decoder keys and
  values as g·L_q queries of one row, not g rows of copies.
- the training step's products in a precision: aiayn.train_kernels, the tricks of this module's
  family that change how a linear layer trains (`Bf16Twin`, `fp32_linears`).
- the model to decode with, its weights cast, quantized or laid out once: aiayn.inference, the
  tricks of this module's family that a decoding copy's weights hold.

One switch turns every trick off: inside `with reference_math():` attention runs the reference
`softmax(QKᵀ/√d_k)V` of aiayn.attention, dropout is `nn.Dropout`, the loss is autograd through
`log_softmax` (aiayn.loss), nothing is cast and no weight is laid out. The beams' queries are
still folded (`fold_queries`: the same products, each query against the same keys). The switch
holds for the whole process, every thread included: it is for tests and comparisons, not for
one request among others.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

_reference = False


@contextmanager
def reference_math() -> Iterator[None]:
    """Compute everything the reference way (the paper's formulas, no kernel choice)."""
    global _reference
    previous, _reference = _reference, True
    try:
        yield
    finally:
        _reference = previous


def use_reference() -> bool:
    return _reference


# --------------------------------------------------------------------------------------------
# Masks


def attention_mask(
    mask: Optional[Tensor], causal: bool, neighborhood: Optional[int], q_len: int, k_len: int, device: torch.device
) -> Optional[Tensor]:
    """`mask` and'ed with the causal rule (§3.2.3: no attention to later positions) and the
    restricted neighbourhood (Table 1: |i - j| ≤ r // 2). Query i sits at position
    k_len - q_len + i, so with a KV cache the queries are the newest positions.
    Returns a bool mask broadcastable to (..., q_len, k_len), or None when nothing is masked."""
    causal = causal and q_len > 1  # a single newest query may see every key
    if not causal and neighborhood is None:
        return mask
    query_pos = torch.arange(k_len - q_len, k_len, device=device).unsqueeze(1)  # (L_q, 1)
    key_pos = torch.arange(k_len, device=device).unsqueeze(0)  # (1, L_k)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)  # (L_q, L_k)
    if causal:
        allowed &= key_pos <= query_pos
    if neighborhood is not None:
        allowed &= (key_pos - query_pos).abs() <= neighborhood // 2
    return allowed if mask is None else mask & allowed


# --------------------------------------------------------------------------------------------
# Attention kernels: (q (B, h, L_q, d_k), k (B, h, L_k, d_k), v (B, h, L_k, d_v), mask, causal,
# dropout_p) -> (B, h, L_q, d_v). `mask` is bool, True = may attend, broadcastable to
# (B, h, L_q, L_k); `causal`: the queries are the last L_q of the L_k positions, none sees a later one.

Kernel = Callable[[Tensor, Tensor, Tensor, Optional[Tensor], bool, float], Tensor]


# The fused kernels a GPU may run, cuDNN's left out. PyTorch 2.11 sends a masked bf16 call on an
# H100 to cuDNN first, and cuDNN builds an execution plan for every new problem shape, hundreds of
# milliseconds each (pytorch/pytorch#155958 and the reports around it), where real batches bring
# a new (rows, length) nearly every step. On an H100 (2026-11-26) every system that let PyTorch
# choose trained Transformer-base in bf16 at 3,125-token batches 6.6-10.8x slower than in TF32,
# while Eole, which allows the memory-efficient kernel only, trained 5x faster than aiayn
# (benchmarks/results/speed-train-budgets-cuda-h100.json). With cuDNN left out, aiayn's bf16
# step at 25,000-token batches ran 3.6x faster than before, 1.35x its TF32 step
# (speed-train-25000-cuda-h100.json).
GPU_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool, dropout_p: float = 0.0) -> Tensor:
    """PyTorch's fused kernel (on a GPU one of `GPU_SDPA_BACKENDS`). A causal self-attention
    without another mask takes its `is_causal` path, which reads no (L, L) mask."""
    with sdpa_kernel(GPU_SDPA_BACKENDS) if q.is_cuda else nullcontext():
        if causal and mask is None and q.size(-2) == k.size(-2):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        mask = attention_mask(mask, causal, None, q.size(-2), k.size(-2), q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool, dropout_p: float = 0.0) -> Tensor:
    """softmax(QKᵀ / √d_k) V as two plain matrix products, the softmax in fp32 at least."""
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, h, L_q, L_k)
    mask = attention_mask(mask, causal, None, q.size(-2), k.size(-2), q.device)
    if mask is not None and torch.is_grad_enabled():
        # The dtype's lowest number added where masked, rather than -inf filled in: the backward
        # then needs no mask, and a compiled step saves no bool (B, h, L_q, L_k) tensor for it
        # (see `relu`). A masked key's weight is still exactly 0 (exp underflows), and a query
        # that sees no key gets finite weights, zeroed below, rather than NaNs that would reach
        # the gradients through the addition.
        # Half the dtype's lowest: a score added to the lowest itself overflowed fp16 (-65504 less a
        # score of -16 is -inf), and a query whose keys were all masked got NaN gradients (found in review).
        lowest = torch.tensor(torch.finfo(scores.dtype).min / 2, dtype=scores.dtype, device=scores.device)
        scores = scores + torch.where(mask, 0.0, lowest)  # (B, h, L_q, L_k)
    elif mask is not None:  # no backward (decoding): the fill is the cheaper op at a step's few queries
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))  # (B, h, L_q, L_k)
    if mask is not None:  # the softmax of an all -inf row is NaN; such a query attends to nothing
        sees = mask.any(dim=-1, keepdim=True)  # (..., L_q, 1)
        # A training batch has no such query (every sentence has its EOS): an eager step on a
        # CPU skips the pass over the weights. Elsewhere asking would wait for the device, or
        # break a compiled graph in two (where the compiler fuses the pass anyway).
        if q.device.type != "cpu" or torch.compiler.is_compiling() or not sees.all():
            weights = weights.masked_fill(~sees, 0.0)
    weights = weights.to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v  # (B, h, L_q, d_v)


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    neighborhood: int,
    key_mask: Optional[Tensor] = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """Restricted self-attention (§4, Table 1): position i attends only to positions j with
    |i - j| ≤ r // 2, in O(n·r) time and memory instead of O(n²).

    The n positions are cut into blocks of c = max(min(r // 2, n), 1); every key within r // 2
    of a query lies in the query's block or one of its two neighbours, so each block of c queries
    is scored against 3c keys and the band is masked inside them (a radius past the sequence is
    one block: found in review, blocks of r // 2 padded positions made r ≫ n thousands of times
    slower). Equal to the dense computation with `attention_mask(..., neighborhood=r)`.
    q, k, v: (B, h, n, d) of one sequence (self-attention); key_mask: (B, 1, 1, n) bool or None.
    Returns (B, h, n, d_v).
    """
    batch, heads, n, d_k = q.shape
    if q.numel() == 0:  # no sentence or no position: nothing to block (the empty product keeps the graph)
        return matmul_attention(q, k, v, key_mask, causal, dropout_p)
    half = neighborhood // 2
    c = max(min(half, n), 1)
    blocks = -(-n // c)
    extra = blocks * c - n  # padding that fills the last block

    def windows(x: Tensor) -> Tensor:  # (..., n, d) -> (..., blocks, 3c, d): keys seen by each block
        x = F.pad(x, (0, 0, c, extra + c))  # (..., (blocks + 2)·c, d)
        return x.unfold(-2, 3 * c, c).transpose(-2, -1)

    queries = F.pad(q, (0, 0, 0, extra)).view(batch, heads, blocks, c, d_k)  # (B, h, blocks, c, d_k)
    offset = torch.arange(3 * c, device=q.device) - c  # key index relative to the block's first query
    relative = offset.unsqueeze(0) - torch.arange(c, device=q.device).unsqueeze(1)  # (c, 3c): j - i
    band = relative.abs() <= half
    if causal:
        band &= relative <= 0
    key_pos = torch.arange(blocks, device=q.device).unsqueeze(1) * c + offset  # (blocks, 3c)
    allowed = band & ((key_pos >= 0) & (key_pos < n)).unsqueeze(1)  # (blocks, c, 3c)
    if key_mask is not None:
        keys_kept = windows(key_mask.expand(batch, 1, 1, n).reshape(batch, 1, n, 1)).squeeze(-1)  # (B, 1, blocks, 3c)
        allowed = allowed & keys_kept.unsqueeze(-2)  # (B, 1, blocks, c, 3c)
    out = matmul_attention(queries, windows(k), windows(v), allowed, False, dropout_p)  # (B, h, blocks, c, d_v)
    return out.reshape(batch, heads, blocks * c, -1)[:, :, :n]  # (B, h, n, d_v)


# Queries per row up to which a CPU computes attention faster as two matrix products than with
# the fused kernel: a decoding step has 1 (self-attention) or the beam size (the beams of a
# sentence against its memory). benchmarks/decode_kernels.py, 8 heads × d_k 64, AMD EPYC
# (Zen 4): 256 rows of 1 query against 17 keys, matmul 0.34 ms vs fused 0.71 ms in fp32 (0.71
# vs 3.4 ms in bf16); 64 rows of 4 queries against 32 keys, 0.35 vs 1.26 ms. At 128 queries
# against 128 keys the fused kernel is the faster one (25 ms vs 72 ms).
FEW_QUERIES = 8


def attention_kernel(q: Tensor, k: Tensor, mask: Optional[Tensor], neighborhood: Optional[int]) -> Optional[Kernel]:
    """The kernel for one attention call, or None for the reference math (inside
    `reference_math()`, or for a neighbourhood the block-wise kernel cannot take: queries that
    are not the whole sequence, or a mask over queries).

    - a neighbourhood r: `local_attention`;
    - on a CPU, bf16 training or at most FEW_QUERIES queries per row: `matmul_attention`;
    - otherwise `fused_attention`.
    """
    if _reference:
        return None
    bf16_training = k.dtype == torch.bfloat16 and torch.is_grad_enabled()
    if neighborhood is not None:
        key_mask_only = mask is None or (mask.dim() == 4 and mask.size(1) == 1 and mask.size(-2) == 1)  # not per head
        if q.size(-2) != k.size(-2) or not key_mask_only:
            return None
        kernel = lambda q, k, v, mask, causal, dropout_p: local_attention(q, k, v, neighborhood, mask, causal, dropout_p)  # noqa: E731
    elif q.device.type == "cpu" and (bf16_training or q.size(-2) <= FEW_QUERIES):
        kernel = matmul_attention
    else:
        kernel = fused_attention
    if q.dtype == k.dtype:
        return kernel
    # An int8 model's fp32 queries against its bf16 cache (`cache_dtype`): computed in the cache's dtype.
    return lambda q, k, v, *rest: kernel(q.to(k.dtype), k, v, *rest).to(q.dtype)


def fold_queries(q: Tensor, kv_rows: int) -> Tensor:
    """Queries (B, h, L_q, d) whose B = g·kv_rows rows come in groups of g consecutive rows that
    share one row of keys and values (the beams of a sentence share its encoder-decoder keys and
    values, aiayn.cache) -> (B / g, h, g·L_q, d): the g rows' queries as positions of their one
    row, so one product per sentence reads its keys once rather than g times. No query sees
    another's: the keys are the same for all of them, and attention is per query."""
    batch, heads, length, width = q.shape
    group = batch // kv_rows
    q = q.reshape(kv_rows, group, heads, length, width).transpose(1, 2)  # (B / g, h, g, L_q, d)
    return q.reshape(kv_rows, heads, group * length, width)  # (B / g, h, g·L_q, d)


def unfold_queries(x: Tensor, batch: int) -> Tensor:
    """`fold_queries` undone on its output: (B / g, h, g·L_q, d) -> (B, h, L_q, d)."""
    kv_rows, heads, folded, width = x.shape
    group = batch // kv_rows
    x = x.reshape(kv_rows, heads, group, folded // group, width).transpose(1, 2)  # (B / g, g, h, L_q, d)
    return x.reshape(batch, heads, folded // group, width)  # (B, h, L_q, d)


# --------------------------------------------------------------------------------------------
# Dropout (§5.4)


class Dropout(nn.Dropout):
    """`nn.Dropout`, drawn faster on a CPU: one 64-bit random draw serves four elements, 16
    uniform bits each, and an element is dropped when its bits fall below round(p · 2^16), so
    P_drop is p to within 2^-17 (0.1 becomes 0.100006). On a GPU, and under `reference_math()`,
    it is `nn.Dropout` itself.

    The mask is made in x's dtype once: a bool mask would be cast to it again by the product in
    the forward, and again in the backward.

    The draws are one out-of-place `torch.randint`, which torch.compile traces without a graph
    break; a compiled step (aiayn.train.TrainStep, Inductor's `fallback_random`) then draws them
    from the same generator, so it drops exactly what the eager step drops. Inductor's own
    per-element random numbers were several times slower than these draws on a CPU."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:  # the identity, as nn.Dropout's, without its call
            return x
        threshold = round(self.p * 65536) - 32768
        # p within 2^-17 of 1 has no int16 threshold (32768 wrapped to -32768 and kept all: found
        # in review), and the in-place form is nn.Dropout's.
        if x.device.type != "cpu" or _reference or threshold >= 32768 or self.inplace:
            return super().forward(x)
        n = x.numel()
        draws = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)  # 64 random bits each
        bits = draws.view(torch.int16)[:n].view(x.shape)  # 16 uniform bits each, on [-2^15, 2^15)
        if torch.compiler.is_compiling():
            # the same mask by arithmetic: a comparison would be saved as a bool mask (see `relu`)
            keep = torch.clamp(bits.to(torch.int32) - (threshold - 1), 0, 1).to(x.dtype)
        else:
            keep = (bits >= threshold).to(x.dtype)  # 1 where kept, 0 where dropped
        return x * keep * (1.0 / (1.0 - self.p))


# --------------------------------------------------------------------------------------------
# ReLU (§3.3)


class _ReLUFromOutput(torch.autograd.Function):
    """y = max(0, x), whose gradient g · sign(y) is computed from y (y ≥ 0: sign(y) is 1 where
    x > 0, else 0), with no comparison and so no bool mask."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.relu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad * torch.sign(y)


def relu(x: Tensor) -> Tensor:
    """max(0, x), the feed-forward network's non-linearity (§3.3).

    Under torch.compile its gradient comes from the output by `_ReLUFromOutput`. ReLU's own
    gradient compares, and AOTAutograd saves the smallest tensor a backward needs: the (N, d_ff)
    bool mask of that comparison. Inductor (torch 2.13) writes a bool tensor on a CPU through a
    scalar loop (at::vec's generic mask-to-bool conversion) and reads it back the same way: the
    two kernels took 11 and 6 ms per layer at 2,000-token batches on an AMD EPYC (Zen 5), where
    the eager ReLU and its gradient take 0.4 ms each (benchmarks/results/profile-train-amd-epyc-
    zen5-bf16-compiled-2000-e3e5578.txt and profile-train-amd-epyc-zen5-bf16-2000.txt), and made
    the compiled step slower than the eager one. Eager, ATen's ReLU gradient is one pass, where
    g · sign(y) is two."""
    if torch.compiler.is_compiling() and not _reference:
        return _ReLUFromOutput.apply(x)
    return F.relu(x)


# --------------------------------------------------------------------------------------------
# The loss's log-softmax (§5.4)

# Rows of logits per chunk: an fp32 chunk of about 1 MB stays in a CPU core's L2 cache through
# the passes over it; a GPU takes bigger chunks, to launch fewer kernels.
CHUNK_ELEMENTS = {"cpu": 1 << 18}
GPU_CHUNK_ELEMENTS = 1 << 24


def _chunks(n_rows: int, n_cols: int, device: torch.device) -> Iterator[slice]:
    rows = max(1, CHUNK_ELEMENTS.get(device.type, GPU_CHUNK_ELEMENTS) // n_cols)
    return (slice(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows))


class _LogSoftmaxStats(torch.autograd.Function):
    """(N, V) logits z and (N,) targets y -> nll = -log p(y) and total = Σ_k log p(k), each (N,),
    for p = softmax(z), in fp32 (or the logits' dtype, if wider), a chunk of rows at a time.

    The gradients are written out: ∂nll/∂z = p - onehot(y) and ∂total/∂z = 1 - V·p, so for
    incoming (N,) gradients g_nll and g_total, ∂/∂z = a·p + b - g_nll·onehot(y) with a = g_nll -
    V·g_total and b = g_total. The forward keeps p in the logits' dtype (half the bytes of the
    fp32 log-probabilities autograd would keep, for bf16 logits) and p(y) in fp32, so that the
    reference token's gradient, a difference of two numbers near 1 when the model is confident,
    is computed from the unrounded p(y)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        n, vocab = logits.shape
        compute = torch.promote_types(logits.dtype, torch.float32)
        probs = torch.empty_like(logits)  # (N, V) p, in the logits' dtype
        nll = torch.empty(n, dtype=compute, device=logits.device)  # (N,)
        total = torch.empty(n, dtype=compute, device=logits.device)  # (N,)
        p_target = torch.empty(n, dtype=compute, device=logits.device)  # (N,)
        for rows in _chunks(n, vocab, logits.device):
            # z - max(z), then exp once: log p = (z - max) - log s, with s = Σ exp(z - max)
            shifted = logits[rows].to(compute, copy=True)  # (c, V)
            shifted -= shifted.amax(dim=1, keepdim=True)
            picked = shifted.gather(1, target[rows].unsqueeze(1)).squeeze(1)  # (c,)
            total_shifted = shifted.sum(dim=1)  # (c,)
            exp = shifted.exp_()  # (c, V)
            sums = exp.sum(dim=1, keepdim=True)  # (c, 1)
            log_sums = sums.squeeze(1).log()  # (c,)
            nll[rows] = log_sums - picked
            total[rows] = total_shifted - vocab * log_sums
            p_target[rows] = (picked - log_sums).exp()
            torch.div(exp, sums, out=probs[rows])  # rounded into the logits' dtype by the same call
        ctx.save_for_backward(probs, p_target, target)
        ctx.set_materialize_grads(False)  # training back-propagates the loss, not the nll as well
        return nll, total

    @staticmethod
    def backward(ctx, grad_nll: Optional[Tensor], grad_total: Optional[Tensor]):
        probs, p_target, target = ctx.saved_tensors
        n, vocab = probs.shape
        g_nll = torch.zeros_like(p_target) if grad_nll is None else grad_nll  # (N,)
        g_total = torch.zeros_like(p_target) if grad_total is None else grad_total  # (N,)
        a, b = g_nll - vocab * g_total, g_total  # (N,)
        grad = torch.empty_like(probs)  # (N, V)
        for rows in _chunks(n, vocab, probs.device):
            # computed in fp32 (a's dtype), rounded into the gradient's rows by the same call
            torch.addcmul(b[rows].unsqueeze(1), probs[rows], a[rows].unsqueeze(1), out=grad[rows])
        at_target = a * p_target + b - g_nll  # (N,)
        # an indexed store, not scatter_, which copied the whole (N, V) gradient twice on a CPU
        grad[torch.arange(n, device=grad.device), target] = at_target.to(grad.dtype)
        return grad, None


def log_softmax_stats(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """-log p(y) and Σ_k log p(k) per row of (N, V) `logits` for (N,) `target`, p = softmax(logits),
    in fp32 whatever the logits' precision, by the chunked kernel above."""
    return _LogSoftmaxStats.apply(logits, target)


# --------------------------------------------------------------------------------------------
# Casts


def autocast_input(x: Tensor) -> Tensor:
    """x in autocast's low precision, once: autocast would otherwise cast the same activation for
    each of W^Q, W^K and W^V, three copies instead of one (and three more in the backward)."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and not _reference:
        return x.to(torch.get_autocast_dtype(device))
    return x


def cache_dtype(model: nn.Module, memory: Tensor, beam: int) -> torch.dtype:
    """The dtype a decoder keeps its keys and values in, and attends in: the one its projections
    of `memory` come out in (autocast's, when it is on), except in a beam search with an int8
    model (fp32 activations around int8 products) on a CPU with fast bf16 (AVX512-BF16, AMX).
    There the cache is kept in bf16, which halves the bytes that every step moves to reorder
    the beams' keys and values and to attend over them, memory-bound copies that took a fifth
    of an int8 beam search's time on an AMD EPYC (Zen 4). Greedy search reorders nothing, and
    there the fp32 cache is the faster one."""
    device = memory.device.type
    if (not _reference and beam > 1 and getattr(model, "inference_precision", None) == "int8" and device == "cpu"
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return torch.bfloat16
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else memory.dtype


# --------------------------------------------------------------------------------------------
# Source widths of continuous batching

# oneDNN runs a CPU's bf16 matrix products with a kernel compiled for each problem shape, kept
# in a cache of a few hundred (aiayn.device). A server's sentences join one at a time, each with
# its own length: every new length meant compiling the encoder's products and the encoder-decoder
# attention's anew, about 0.3 ms each. A join took 3.9 ms on an AMD EPYC (Zen 5), and 3.0 ms with
# padded widths and the server's kernel cache (benchmarks/decode_steps.py). Padded to a multiple
# of 8, the lengths of a bible verse fall into about a dozen widths; the padding is masked, as in
# any batch.
SOURCE_WIDTH_MULTIPLE = 8


def source_width(length: int) -> int:
    """The positions a source of `length` (with its EOS) takes in a continuous batch."""
    if _reference:
        return length
    return -(-length // SOURCE_WIDTH_MULTIPLE) * SOURCE_WIDTH_MULTIPLE
