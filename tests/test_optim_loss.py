"""The training recipe's formulas (§5.3, §5.4) against the paper and the lecture's examples."""

import math

import pytest
import torch

from aiayn.loss import label_smoothed_nll, smoothed_target
from aiayn.optim import make_optimizer, noam_lr


def test_learning_rate_example_from_the_lecture():
    # d_model = 4, step 1000, warmup 2000: 0.5 · min(0.0316, 0.01118) ≈ 0.00559.
    assert noam_lr(1000, d_model=4, warmup_steps=2000) == pytest.approx(0.00559, abs=5e-6)
    assert noam_lr(1000, 4, 2000) == 0.5 * 1000 * 2000**-1.5


def test_schedule_is_the_formula_of_section_5_3():
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert noam_lr(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    peak = noam_lr(4000, 512, 4000)
    assert peak == pytest.approx((512 * 4000) ** -0.5)
    assert noam_lr(2000, 512, 4000) == pytest.approx(peak / 2)  # linear warm-up
    assert noam_lr(16000, 512, 4000) == pytest.approx(peak / 2)  # inverse square root decay
    assert noam_lr(100, 512, 4000, scale=2.0) == 2 * noam_lr(100, 512, 4000)
    with pytest.raises(ValueError, match="from 1"):
        noam_lr(0, 512, 4000)


def test_adam_has_the_papers_settings():
    optimizer = make_optimizer(torch.nn.Linear(2, 2))
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9


def test_in_class_question_probability_of_the_true_class():
    """With ε_ls = 0.1 (the default setting) the ground-truth class keeps probability 0.9."""
    q = smoothed_target(torch.tensor([5]), vocab_size=37000, epsilon=0.1)
    assert q[0, 5].item() == pytest.approx(0.9)
    assert q[0, 0].item() == pytest.approx(0.1 / 36999)
    assert q.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_smoothed_loss_is_kl_to_the_smoothed_target_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    target = torch.tensor([[4, 7, 0], [2, 0, 0]])  # 0 is padding
    loss, nll = label_smoothed_nll(logits, target, epsilon=0.1, pad_id=0)
    log_p = torch.log_softmax(logits, -1).view(-1, 11)
    q = smoothed_target(target.view(-1), 11, 0.1)
    keep = target.view(-1) != 0
    expected = (q * (q.log() - log_p)).sum(-1)[keep].sum()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, -log_p[keep].gather(1, target.view(-1, 1)[keep]).sum())
    plain, plain_nll = label_smoothed_nll(logits, target, epsilon=0.0, pad_id=0)
    torch.testing.assert_close(plain, plain_nll)
    # A prediction equal to q' scores zero.
    perfect = smoothed_target(torch.tensor([3]), 11, 0.1).log()
    assert label_smoothed_nll(perfect, torch.tensor([3]), 0.1, 0)[0].item() == pytest.approx(0.0, abs=1e-5)
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_hand_written_gradient_equals_autograd_of_the_formula(epsilon):
    """The loss's backward is written out (p - q'); it must equal autograd through the formula."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 11, (3, 4))
    target[0, 2:] = 0  # padding
    loss, nll = label_smoothed_nll(logits, target, epsilon, pad_id=0)
    (0.7 * loss + 0.3 * nll).backward()
    ours = logits.grad.clone()
    logits.grad = None
    log_p = torch.log_softmax(logits, dim=-1).view(-1, 11)
    q = smoothed_target(target.view(-1), 11, epsilon)
    keep = (target.view(-1) != 0).double()
    kl = ((q * (q.clamp_min(1e-30).log() - log_p)).sum(1) * keep).sum()
    picked = (-log_p.gather(1, target.view(-1, 1)).squeeze(1) * keep).sum()
    (0.7 * kl + 0.3 * picked).backward()
    torch.testing.assert_close(ours, logits.grad)
    torch.testing.assert_close(loss, kl.detach())
