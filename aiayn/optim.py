"""The optimiser of §5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 10⁻⁹, and a learning rate that rises
linearly for `warmup_steps` steps, then decays with the inverse square root of the step number:

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)
"""

from __future__ import annotations

import torch
from torch import nn


def noam_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The learning rate of §5.3 at optimiser step `step` (counted from 1), times `scale`.

    The two branches meet at step = warmup_steps, where the rate peaks at
    scale · (d_model · warmup_steps)^-0.5.
    """
    if step < 1:
        raise ValueError(f"the schedule counts steps from 1, got {step}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer(model: nn.Module, betas=(0.9, 0.98), eps: float = 1e-9) -> torch.optim.Adam:
    """Adam with the paper's β and ε; the learning rate is set every step by `set_lr`."""
    return torch.optim.Adam(model.parameters(), lr=0.0, betas=betas, eps=eps, fused=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
