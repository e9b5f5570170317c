"""The FLOPs formula against PyTorch's own count of a real forward pass."""

import torch
from torch.utils.flop_counter import FlopCounterMode

import aiayn.attention
from aiayn.attention import scaled_dot_product_attention
from aiayn.kernels import attention_mask
from aiayn.config import ModelConfig
from aiayn.flops import forward_flops, training_flops
from aiayn.model import Transformer


def measured_forward_flops(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    model = Transformer(config).eval()
    src = torch.randint(4, config.vocab_size, (1, src_len))
    tgt = torch.randint(4, config.vocab_size, (1, tgt_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(src, tgt)
    return counter.get_total_flops()


def reference_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    mask = attention_mask(attn_mask, is_causal, None, q.size(-2), k.size(-2), q.device)
    return scaled_dot_product_attention(q, k, v, mask)[0]


def test_forward_flops_equal_torch_flop_counter(monkeypatch):
    # The counter does not see inside PyTorch's fused CPU attention kernel; run the reference
    # math path instead, whose two matrix products it counts (a causal QKᵀ is counted whole).
    monkeypatch.setattr(aiayn.attention.F, "scaled_dot_product_attention", reference_sdpa)
    for config, (s, t) in (
        (ModelConfig(vocab_size=97, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0), (7, 5)),
        (ModelConfig(vocab_size=50, d_model=24, n_heads=3, d_k=5, d_v=9, d_ff=40, n_layers=1), (4, 11)),
    ):
        assert forward_flops(config, s, t) == measured_forward_flops(config, s, t)
        assert training_flops(config, s, t) == 3 * forward_flops(config, s, t)
