"""The FLOPs formula against PyTorch's own count of a real forward pass, and the training peak
estimate against the measured peaks."""

import dataclasses
import json
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import aiayn.attention
from aiayn.attention import scaled_dot_product_attention
from aiayn.kernels import attention_mask, reference_math
from aiayn.config import PRESETS, ModelConfig, TrainConfig
from aiayn.flops import decoder_step_flops, forward_flops, memory_warning, training_flops, training_peak_bytes
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


def test_a_decoding_step_costs_what_decoder_step_flops_counts():
    """One step of incremental decoding on a KV cache holding 2 positions (the step writes the
    third) of a 6-position source, counted by PyTorch over the reference math's products."""
    config = ModelConfig(vocab_size=61, d_model=24, n_heads=3, d_k=5, d_v=7, d_ff=40, n_layers=2, dropout=0.0)
    model, rows, src_len = Transformer(config).eval(), 3, 6
    with torch.no_grad(), reference_math():
        memory, mask = model.encode(torch.randint(4, config.vocab_size, (rows, src_len)))
        cache = model.init_cache(memory, mask, max_len=8)
        for _ in range(2):
            model.next_log_probs(torch.full((rows,), config.bos_id), cache)
        with FlopCounterMode(display=False) as counter:
            model.next_log_probs(torch.full((rows,), config.bos_id), cache)
    assert counter.get_total_flops() == rows * decoder_step_flops(config, 3, src_len)


def test_restricted_self_attention_counts_the_pairs_its_mask_allows():
    """Table 1's restricted self-attention scores O(n·r) pairs, not n²: the count is the pairs
    `attention_mask` lets through, for a whole sequence (queries × keys, the causal mask ignored
    as in the unrestricted count) and for a decoding step's one newest query."""
    base = ModelConfig(vocab_size=61, d_model=24, n_heads=3, d_k=5, d_v=7, d_ff=40, n_layers=2)
    per_pair = 2 * base.n_layers * base.n_heads * (5 + 7)  # QKᵀ and weights · V in every layer
    for r in (1, 2, 5, 8, 30):
        config = dataclasses.replace(base, neighborhood=r)
        spared = lambda n: n * n - int(attention_mask(None, False, r, n, n, torch.device("cpu")).sum())  # noqa: E731
        for n in (1, 3, 9, 40):
            assert forward_flops(base, n, 6) - forward_flops(config, n, 6) == per_pair * (spared(n) + spared(6))
            assert forward_flops(base, 6, n) - forward_flops(config, 6, n) == per_pair * (spared(6) + spared(n))
            seen = int(attention_mask(None, True, r, 1, n, torch.device("cpu")).sum())
            assert decoder_step_flops(base, n, 6) - decoder_step_flops(config, n, 6) == per_pair * (n - seen)


def test_the_training_peak_estimate_meets_the_measured_peaks():
    """Every committed measurement of benchmarks/train_peak.py, on any CPU kind, within a fifth of
    the estimate (the run-to-run spread of a peak resident set is about a tenth)."""
    files = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "results").glob("train-peak-*.json"))
    assert files
    for path in files:
        for row in json.loads(path.read_text())["rows"]:
            preset = "base" if row["case"].startswith("base") else "small"
            changes = {"n_layers": 6} if "6 layers" in row["case"] else {}
            changes.update({"vocab_size": int(row["case"].split("vocabulary ")[1].replace(",", ""))}
                           if "vocabulary" in row["case"] else {})
            estimate = training_peak_bytes(dataclasses.replace(PRESETS[preset], **changes), row["max_tokens"]) / 2**20
            assert 0.8 <= estimate / row["peak_mib"] <= 1.25, (path.name, row)


def test_the_training_peak_holds_16_bytes_a_parameter_and_fewer_activations_under_autocast():
    """fp32 weights, gradients and Adam's two moments whatever the precision; fp16's autocast
    keeps activations as bf16's does (found by mutation: 12 bytes a parameter fit the measured
    peaks' tolerance, and fp16 counted as fp32 passed every test)."""
    from aiayn.checkpoint import meta_model
    from aiayn.flops import PROCESS_BYTES

    base = PRESETS["base"]
    assert training_peak_bytes(base, 0) == PROCESS_BYTES + 16 * meta_model(Transformer, base).num_parameters()
    assert training_peak_bytes(base, 1000, "fp16") == training_peak_bytes(base, 1000, "bf16") < training_peak_bytes(base, 1000)


def test_a_run_that_would_not_fit_is_warned_with_the_batch_in_parts(monkeypatch):
    base, recipe = PRESETS["base"], TrainConfig()  # the paper's 25,000 tokens
    need = training_peak_bytes(base, recipe.max_tokens)
    monkeypatch.setattr("aiayn.flops.available_bytes", lambda: need)  # exactly enough (found by mutation: < passed)
    assert memory_warning(base, recipe, torch.device("cpu")) is None
    monkeypatch.setattr("aiayn.flops.available_bytes", lambda: training_peak_bytes(base, recipe.max_tokens // 2))
    assert "--accumulate 2 " in memory_warning(base, recipe, torch.device("cpu"))  # halves first (found by mutation)
    monkeypatch.setattr("aiayn.flops.available_bytes", lambda: need // 3)
    warning = memory_warning(base, recipe, torch.device("cpu"))
    assert warning.startswith("warning: this run may not fit in memory") and f"{need / 2**30:.1f} GiB" in warning
    parts = int(warning.split("--accumulate ")[1].split()[0])  # the fewest parts that fit
    assert training_peak_bytes(base, recipe.max_tokens // parts) <= need // 3 < training_peak_bytes(base, recipe.max_tokens // (parts // 2))
    assert f"--max-tokens {recipe.max_tokens // parts:,}" in warning
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's processes on this machine share its memory
    monkeypatch.setattr("aiayn.flops.available_bytes", lambda: need + 1)
    assert "over 4 processes" in memory_warning(base, recipe, torch.device("cpu"))
    assert memory_warning(base, recipe, torch.device("cuda")) is None  # a GPU's memory is not the system's


def test_a_containers_memory_limit_bounds_what_is_available(tmp_path):
    """cgroup v2 and v1 as a container mounts them: the limit less the working set (usage less
    the inactive file pages the kernel can drop), and no bound where no limit is set."""
    from aiayn.device import cgroup_room

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("8589934592\n")  # --memory 8g
    (v2 / "memory.current").write_text(str(3 * 2**30))
    (v2 / "memory.stat").write_text(f"anon 1000\ninactive_file {2**30}\nactive_file 5\n")
    assert cgroup_room(v2) == 8 * 2**30 - (3 * 2**30 - 2**30)
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_room(v2) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(4 * 2**30))
    (v1 / "memory.usage_in_bytes").write_text(str(5 * 2**30))  # over the limit in page cache
    (v1 / "memory.stat").write_text(f"inactive_file 7\ntotal_inactive_file {2 * 2**30}\n")
    assert cgroup_room(tmp_path / "v1") == 2**30
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert cgroup_room(tmp_path / "v1") is None
    assert cgroup_room(tmp_path / "none") is None
