"""Label-smoothed cross-entropy (§5.4, "Label Smoothing", ε_ls = 0.1).

The target distribution puts 1 - ε on the reference token and spreads ε uniformly over the other
V - 1 tokens, as the authors' tensor2tensor code does (`smoothing_cross_entropy`). Padding
positions carry no loss. The loss is the cross-entropy H(q', p) minus the entropy of q', i.e. the
KL divergence, so a perfect prediction of q' scores 0 and the value is comparable across ε.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

from aiayn.kernels import log_softmax_stats, use_reference


def perplexity(nll: float) -> float:
    """exp(the mean negative log-likelihood per token); inf where that overflows a float (a
    diverging run's), not an OverflowError."""
    return math.exp(nll) if nll < math.log(sys.float_info.max) else math.inf


def smoothed_target(target: Tensor, vocab_size: int, epsilon: float) -> Tensor:
    """The smoothed distribution q' for each target id: (N,) -> (N, vocab_size)."""
    q = torch.full((target.numel(), vocab_size), epsilon / (vocab_size - 1), dtype=torch.float32, device=target.device)
    return q.scatter_(1, target.view(-1, 1), 1.0 - epsilon)


def _log_softmax_stats(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """-log p(y) and Σ_k log p(k) per row, by autograd through log_softmax: the reference math
    that aiayn.kernels.log_softmax_stats computes in chunks."""
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (N, V)
    return -log_probs.gather(1, target.unsqueeze(1)).squeeze(1), log_probs.sum(dim=1)


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """logits: (..., V), target: (...) ids. Returns (loss summed over non-pad tokens, negative
    log-likelihood summed likewise); the caller divides by its token count.

    Σ_t KL(q'_t ‖ p_t) = Σ_t [-(1-ε) log p_t(y_t) - ε/(V-1) Σ_{k≠y_t} log p_t(k)] - H(q'),
    computed without building q' (V may be 37,000), in fp32 whatever the logits' precision, from
    two statistics of each row's log-softmax (aiayn.kernels.log_softmax_stats, which never holds
    the (N, V) log-probabilities; under `reference_math()` autograd through `log_softmax`).
    """
    vocab_size = logits.size(-1)
    logits, target = logits.reshape(-1, vocab_size), target.reshape(-1)  # (N, V), (N,)
    stats = _log_softmax_stats if use_reference() else log_softmax_stats
    nll, total = stats(logits, target)  # (N,) -log p(y), (N,) Σ_k log p(k)
    keep = target != pad_id
    if epsilon > 0:
        off = epsilon / (vocab_size - 1)
        entropy = -(1 - epsilon) * math.log(1 - epsilon) - epsilon * math.log(off)  # H(q'), a constant
        loss = (1 - epsilon) * nll + off * (-total - nll) - entropy  # -Σ_{k≠y} log p(k) = -total - nll
    else:
        loss = nll
    # where, not loss[keep]: a boolean index asks the device how many rows it keeps (a sync)
    return torch.where(keep, loss, 0.0).sum(), torch.where(keep, nll, 0.0).sum()
