"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1).

The target distribution puts 1 - ε on the reference token and spreads ε uniformly over the other
V - 1 tokens, as the authors' tensor2tensor code does (`smoothing_cross_entropy`). Padding
positions carry no loss. The loss is the cross-entropy H(q', p) minus the entropy of q', i.e. the
KL divergence, so a perfect prediction of q' scores 0 and the value is comparable across ε.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def smoothed_target(target: Tensor, vocab_size: int, epsilon: float) -> Tensor:
    """The smoothed distribution q' for each target id: (N,) -> (N, vocab_size)."""
    q = torch.full((target.numel(), vocab_size), epsilon / (vocab_size - 1), dtype=torch.float32, device=target.device)
    return q.scatter_(1, target.view(-1, 1), 1.0 - epsilon)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The loss of `label_smoothed_nll` with its gradient written out: ∂loss_t/∂z_t = p_t - q'_t
    and ∂nll_t/∂z_t = p_t - onehot(y_t) for the logits z_t. Autograd's generic backward of the
    same formula makes several passes over the (N, V) log-probabilities (log-softmax, gather and
    sum backwards, their sum); this is one pass, then the scatter at the N reference tokens."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):
        vocab_size = logits.size(-1)
        compute = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: fp32, no separate cast
        log_probs = torch.log_softmax(logits, dim=-1, dtype=compute)  # (N, V)
        nll = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        keep = target != pad_id
        if epsilon > 0:
            off = epsilon / (vocab_size - 1)
            entropy = -(1 - epsilon) * math.log(1 - epsilon) - epsilon * math.log(off)  # H(q'), a constant
            sum_others = -log_probs.sum(dim=1) - nll  # -Σ_{k≠y} log p(k), (N,)
            loss = (1 - epsilon) * nll + off * sum_others - entropy
        else:
            loss = nll
        ctx.save_for_backward(log_probs, target, keep)
        ctx.epsilon, ctx.dtype = epsilon, logits.dtype
        return loss[keep].sum(), nll[keep].sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        log_probs, target, keep = ctx.saved_tensors
        epsilon, vocab_size = ctx.epsilon, log_probs.size(-1)
        off = epsilon / (vocab_size - 1) if epsilon > 0 else 0.0
        rows = keep.unsqueeze(1).to(log_probs.dtype)  # (N, 1): pad positions get no gradient
        # q' = off everywhere plus (1 - ε - off) on y; the NLL's target is the one-hot of y.
        grad = torch.exp(log_probs).mul_(rows * (grad_loss + grad_nll)).sub_(rows * (grad_loss * off))  # (N, V)
        at_target = rows.squeeze(1) * (grad_loss * (1 - epsilon - off) + grad_nll)  # (N,)
        grad.scatter_add_(1, target.unsqueeze(1), -at_target.unsqueeze(1))
        return grad.to(ctx.dtype), None, None, None


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """logits: (..., V), target: (...) ids. Returns (loss summed over non-pad tokens, negative
    log-likelihood summed likewise); the caller divides by its token count.

    Σ_t KL(q'_t ‖ p_t) = Σ_t [-(1-ε) log p_t(y_t) - ε/(V-1) Σ_{k≠y_t} log p_t(k)] - H(q'),
    computed without building q' (V may be 37,000), in fp32 whatever the logits' precision.
    """
    vocab_size = logits.size(-1)
    return _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab_size), target.reshape(-1), epsilon, pad_id)
