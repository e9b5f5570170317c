"""Training on a GPU as the paper's 8 did (§5.2): under torchrun, in an NCCL process group, here
with one process, which trains by the code of many (DDP, the all-reduces; aiayn.device.
init_distributed). The two end-to-end tests run twice: on the CPU with gloo at a toy scale, in
the normal suite, and on a CUDA GPU with NCCL, marked `cuda` and skipped without one; the
attention kernels' test runs on a GPU only, and the rules a GPU run relies on are checked on the
CPU. On a GPU machine:

    PYTHONPATH=. python3 -m pytest -m cuda tests/test_cuda.py

The commands run `python -m aiayn` from this checkout (PYTHONPATH), so aiayn need not be
installed; the recipe finds an `aiayn` command that does so first on its PATH.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_faults import corpus_tsv, losses  # noqa: F401  (corpus_tsv is a fixture)
from test_store import toy_pairs, write_wmt_parquet

from aiayn.device import DETERMINISTIC
from aiayn.run import RunDir
from aiayn.store import load_store

REPO = Path(__file__).resolve().parent.parent

DEVICES = [
    pytest.param("cpu", id="cpu-gloo"),
    pytest.param("cuda", id="cuda-nccl", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is false"),
    ]),
]
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def environment(tmp_path: Path, device: str, **extra: str) -> dict:
    """The commands' environment: this checkout importable, and an `aiayn` command (a shim that
    runs `python -m aiayn` with this interpreter) first on the PATH, then this interpreter's own
    folder (torchrun's). On the CPU no GPU, so that `--device auto` (the recipe's) means the
    CPU on any machine, and one thread, as the other torchrun tests have: a toy model gains
    nothing from two, and two threads of a process that shares its cores wait for each other at
    every operation."""
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    shim = shims / "aiayn"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m aiayn "$@"\n')
    shim.chmod(0o755)
    path = os.pathsep.join([str(shims), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    cpu = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"} if device == "cpu" else {}
    return {**os.environ, "PATH": path, "PYTHONPATH": python_path, **cpu, **extra}


def torchrun() -> list[str]:
    """torchrun with a rendezvous of its own on this machine (a port chosen free here could be
    taken before torchrun binds it); the number of processes is the caller's to add."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1"]


def weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "model" / "model.safetensors"))


@pytest.mark.parametrize("device", DEVICES)
def test_one_torchrun_process_trains_checkpoints_and_resumes_exactly(tmp_path, corpus_tsv, device):
    """`torchrun --nproc-per-node 1`: one process in a process group (gloo on the CPU, NCCL on a
    GPU), its model in DDP. Stopped after step k and resumed with --resume, a run logs the losses
    of an uninterrupted run, step for step, and ends with its weights, bit for bit: dropout on
    (each step's draws seeded afresh), bf16 autocast on the GPU.

    On a GPU only with AIAYN_DETERMINISTIC=1 (aiayn.device.deterministic_from_environment): the
    backward of the fused attention kernels adds its partial gradients with atomics otherwise, in
    an order that changes from run to run, and two runs drift apart by rounding from the first
    step. Everything else a step does is a fixed sequence of kernels on the same shapes: cuBLAS
    gives the same bits for the same problem on the same GPU, dropout draws from Philox at the
    seed and offset the step sets, and NCCL's sum over one process is the tensor itself. The CPU
    runs with it too, which changes nothing there but holds every operation of a step to have a
    deterministic algorithm (PyTorch stops at one that has none)."""
    gpu = device == "cuda"
    steps, stop, every = (40, 23, 10) if gpu else (12, 7, 5)
    # A GPU gets batches worth its while and trains in bf16; the CPU the smallest model, in fp32.
    sizes = ["--max-tokens", "1000", "--precision", "bf16"] if gpu else \
        ["--max-tokens", "300", "--d-model", "32", "--d-ff", "64", "--precision", "fp32"]
    env = environment(tmp_path, device, **{DETERMINISTIC: "1"})

    def train(run: Path, max_steps: int, *extra) -> str:
        argv = [*torchrun(), "--nproc-per-node", "1", "-m", "aiayn", "train", "--corpus", corpus_tsv, "--out", run,
                "--preset", "tiny", "--vocab-size", "300", *sizes, "--warmup-steps", "20", "--log-every", "1",
                "--eval-every", "1000", "--save-every", every, "--seed", "3", "--device", device,
                "--max-steps", max_steps, *extra]
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout

    out = train(tmp_path / "straight", steps)
    assert f"process group: {BACKENDS[device]}, 1 process\n" in out, out
    assert f"{DETERMINISTIC}=1: deterministic algorithms only" in out
    assert f"on {'cuda:0 in bf16' if gpu else 'cpu in fp32'}\n" in out, out
    reference = losses(tmp_path / "straight")
    assert sorted(reference) == list(range(1, steps + 1))

    run = tmp_path / "run"
    train(run, stop)
    assert max(losses(run)) == stop and RunDir(run).checkpoints()[-1] == RunDir(run).checkpoint(stop)
    out = train(run, steps, "--resume")
    assert f"resumed from {RunDir(run).checkpoint(stop)} at step {stop}\n" in out, out
    resumed = losses(run)
    assert sorted(resumed) == sorted(reference)
    # every step's loss, bit for bit (a failure shows the first steps that differ, and by how much)
    differ = {step: (resumed[step], reference[step]) for step in reference if resumed[step] != reference[step]}
    assert not differ, f"the first steps whose losses (resumed, uninterrupted) differ: {dict(list(differ.items())[:5])}"
    final, straight = weights(run), weights(tmp_path / "straight")
    assert final.keys() == straight.keys()
    differ = {name: (final[name] - straight[name]).abs().max().item() for name in final
              if not torch.equal(final[name], straight[name])}
    assert not differ, f"{len(differ)} of {len(final)} weight tensors differ; max |difference|: {differ}"


def wmt_length(rng: np.random.Generator) -> int:
    """The words of a sentence as WMT14 en-de spreads them: many short, a long tail (a lognormal
    of mean 25 words), at most 100."""
    sigma = 0.6
    return int(min(100, max(1, round(rng.lognormal(np.log(25) - sigma**2 / 2, sigma)))))


@pytest.mark.parametrize("device", DEVICES)
def test_the_wmt14_recipe_runs_end_to_end(tmp_path, device):
    """recipes/wmt14-en-de-base.sh on WMT14-shaped Parquet files (sentence lengths as WMT's):
    preprocess, train under torchrun (8 batches of MAX_TOKENS a step over the GPUS processes),
    average the last 5 checkpoints, translate with beam 4, score. On a GPU, GPUS=1 with NCCL: the
    real base model in bf16 for 300 steps of the paper's 25,000 tokens, 8 batches of 3,125 a step
    (an H100 took 28 ms for such a batch in TF32, 2026-11-26: about 70 s in all; in bf16 it took
    213 ms while cuDNN's attention planned anew for every batch shape, which aiayn.kernels now
    keeps out). On the CPU, GPUS=2 with gloo (4 batches a process a step), the tiny model for a
    few steps: the recipe's path of many processes, which a machine with one GPU cannot take. The
    dev and test sets are short: an all but untrained model's beam search runs to the length
    limit (source + 50)."""
    gpu = device == "cuda"
    pairs, steps, every = (4000, 300, 60) if gpu else (300, 6, 1)
    folder = write_wmt_parquet(tmp_path / "wmt14" / "de-en", {
        "train": toy_pairs(pairs, 0, wmt_length), "validation": toy_pairs(20, 1, wmt_length),
        "test": toy_pairs(20, 2, wmt_length)})
    sizes = {"MAX_TOKENS": "3125", "PRECISION": "bf16"} if gpu else \
        {"MODEL": "--preset tiny --d-model 32 --d-ff 64", "MAX_TOKENS": "400", "PRECISION": "fp32"}
    processes = 1 if gpu else 2
    work = tmp_path / "work"
    # 340 pieces: the fewest that make each of the toy language's 18 words one token (300 split
    # them in 3 on average), so that sentences are as long in tokens as WMT's are in BPE pieces.
    env = environment(tmp_path, device, CORPUS=str(folder), WORK=str(work), GPUS=str(processes), VOCAB_SIZE="340",
                      STEPS=str(steps), SAVE_EVERY=str(every), TORCHRUN=" ".join(torchrun()), **sizes)
    start = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "recipes" / "wmt14-en-de-base.sh")], capture_output=True, text=True,
                          timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    seconds = time.monotonic() - start

    assert load_store(work / "data").manifest["splits"]["train"]["pairs"] == pairs
    assert f"process group: {BACKENDS[device]}, {processes} process{'es' if processes > 1 else ''}\n" in done.stdout
    assert f"on {'cuda:0 in bf16' if gpu else 'cpu in fp32'}\n" in done.stdout, done.stdout
    train_config = json.loads((work / "run" / "train_config.json").read_text())
    assert (train_config["accumulate"], train_config["max_steps"], train_config["keep_last"]) == (8 // processes, steps, 5)
    records = [json.loads(line) for line in (work / "run" / "log.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["split"] == "train"][-1]
    assert trained["step"] == steps
    print(f"the recipe on {device}: {seconds:.0f} s in all; its {steps} training steps {trained['elapsed_s']:.1f} s "
          f"({1000 * trained['elapsed_s'] / steps:.0f} ms a step, {trained['tokens_per_s']:,.0f} target tokens/s "
          "at the end)")
    if gpu:
        model = json.loads((work / "run" / "model_config.json").read_text())
        assert (model["n_layers"], model["d_model"], model["d_ff"], model["n_heads"]) == (6, 512, 2048, 8)  # §3, base
    last = ", ".join(f"step_{step:08d}" for step in range(steps - 4 * every, steps + 1, every))
    assert f"averaged {last} into {work / 'averaged'}" in done.stdout, done.stdout
    assert (work / "test.hyp.de").read_text(encoding="utf-8").count("\n") == 20
    # The same command again, 2 steps longer (found in review: a rerun stopped at the data it had
    # made, and train without --resume refused the run): the data is kept, the run resumes.
    more = {**env, "STEPS": str(steps + 2 * every)}
    again = subprocess.run(["bash", str(REPO / "recipes" / "wmt14-en-de-base.sh")], capture_output=True, text=True,
                           timeout=400, env=more)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert f"data: {work / 'data'}, made before" in again.stdout and "resumed from" in again.stdout, again.stdout
    records = [json.loads(line) for line in (work / "run" / "log.jsonl").read_text().splitlines()]
    assert [r for r in records if r["split"] == "train"][-1]["step"] == steps + 2 * every
    assert f"step_{steps + 2 * every:08d} into {work / 'averaged'}" in again.stdout
    assert (work / "test.hyp.de").read_text(encoding="utf-8").count("\n") == 20
    assert "sacreBLEU" in done.stdout and "paper protocol" in done.stdout.lower()


def test_the_wmt14_recipe_refuses_bad_settings_before_any_work(tmp_path):
    """Found by a misuse hunt: GPUS=0 or 1.5 was an arithmetic error that `if` took for false, so
    the corpus was preprocessed (hours on WMT14) before ACCUMULATE was unbound, and -8 passed; a
    rerun with another VOCAB_SIZE (or CORPUS) trained on the old data without a word; data without a test
    split was found missing after training."""
    def recipe(**settings: str) -> subprocess.CompletedProcess:
        env = environment(tmp_path, "cpu", CORPUS=str(tmp_path / "nowhere"), WORK=str(tmp_path / "work"), **settings)
        return subprocess.run(["bash", str(REPO / "recipes" / "wmt14-en-de-base.sh")], capture_output=True, text=True,
                              timeout=60, env=env)

    for gpus in ("0", "-8", "1.5", "abc", "3"):
        done = recipe(GPUS=gpus)
        assert done.returncode == 2 and "GPUS must be 1, 2, 4 or 8, a divisor of the paper's 8 GPUs" in done.stderr, done
    assert not (tmp_path / "work").exists()
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "work" / "data" / "manifest.json").write_text(json.dumps({"vocab_size": 340}, indent=1))
    done = recipe(GPUS="2", VOCAB_SIZE="999")
    assert done.returncode == 2 and "was made with VOCAB_SIZE=340, not 999" in done.stderr, done
    (tmp_path / "work" / "data" / "manifest.json").write_text("{}")  # one that records none is not taken for any
    done = recipe(GPUS="2", VOCAB_SIZE="340")
    assert done.returncode == 2 and "was made with VOCAB_SIZE=(none recorded), not 340" in done.stderr, done
    (tmp_path / "work" / "data" / "manifest.json").write_text(json.dumps({"vocab_size": 340, "corpus": "wmt14-de-en"}))
    done = recipe(GPUS="2", VOCAB_SIZE="340")  # (found in review: another CORPUS was unsaid)
    assert done.returncode == 2 and f"was made from CORPUS=wmt14-de-en, not {tmp_path / 'nowhere'}" in done.stderr, done
    manifest = {"vocab_size": 340, "corpus": str(tmp_path / "nowhere")}
    (tmp_path / "work" / "data" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    done = recipe(GPUS="2", VOCAB_SIZE="340")
    assert done.returncode == 2 and "has no test split, which the recipe translates and scores" in done.stderr, done
    assert not (tmp_path / "work" / "run").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is false")
def test_fused_attention_on_a_gpu_runs_no_cudnn_kernel_and_equals_the_reference():
    """aiayn.kernels.fused_attention keeps cuDNN's attention out on a GPU (it plans anew for every
    new shape, GPU_SDPA_BACKENDS): bf16 with padding masks, as a training step's self-attention,
    at two shapes, forward and backward, no cuDNN kernel in the profile. The output equals the
    reference math on the same bf16 inputs, in fp32, within bf16 rounding: the kernels round the
    weights p to bf16 before PV (2^-9 relative each) and the output to bf16 (2^-9 of at most
    max |v|), so |error| <= 2^-8 max |v|; 2^-7 max |v| leaves twice that."""
    from torch.profiler import ProfilerActivity, profile

    from aiayn.attention import scaled_dot_product_attention
    from aiayn.kernels import fused_attention

    generator = torch.Generator("cuda").manual_seed(0)
    for rows, length in ((3, 17), (5, 29)):
        q, k, v = (torch.randn(rows, 8, length, 64, device="cuda", generator=generator).to(torch.bfloat16)
                   .requires_grad_() for _ in range(3))  # (B, h, L, d_k)
        lengths = torch.randint(1, length + 1, (rows,), device="cuda", generator=generator)
        mask = (torch.arange(length, device="cuda") < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L) keys
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = fused_attention(q, k, v, mask, False)  # (B, h, L, d_v)
            out.float().sum().backward()
        kernels = [event.key for event in prof.key_averages()]
        assert kernels and not [name for name in kernels if "cudnn" in name.lower()], kernels
        expected, _ = scaled_dot_product_attention(q.detach().float(), k.detach().float(), v.detach().float(), mask)
        torch.testing.assert_close(out.float(), expected, rtol=0, atol=2**-7 * v.abs().max().item())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is false")
def test_a_training_step_on_a_gpu_waits_for_it_once():
    """A bf16 step of two batches with fused Adam queues all its work on the GPU without a
    synchronizing call (torch.cuda.set_sync_debug_mode("error") makes one raise), so the host
    queues a batch while the GPU runs the one before; then its totals are read back. The
    CPU-side twin of this test, on the meta device, is test_train.py's."""
    import dataclasses

    from aiayn.batching import collate
    from aiayn.config import PRESETS, TrainConfig
    from aiayn.model import Transformer
    from aiayn.optim import make_optimizer
    from aiayn.train import TrainStep

    config = dataclasses.replace(PRESETS["tiny"], vocab_size=300, d_model=64, d_ff=128, n_layers=2)
    model = Transformer(config).to("cuda").train()
    step = TrainStep(model, make_optimizer(model), TrainConfig(precision="bf16"), torch.device("cuda"))
    pairs = [([4 + (i * 7 + j) % 200 for j in range(3 + i % 9)], [4 + (i * 5 + j) % 200 for j in range(2 + i % 7)])
             for i in range(32)]
    batches = [collate(pairs[:16], config.pad_id, config.bos_id, config.eos_id),
               collate(pairs[16:], config.pad_id, config.bos_id, config.eos_id)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        totals = step._step(batches, sum(batch.n_tgt_tokens for batch in batches))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert totals.is_cuda and bool(torch.isfinite(totals).all())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: torch.cuda.is_available() is false")
def test_tf32_training_on_a_gpu_computes_its_products_in_tf32(tmp_path, corpus_tsv, capsys):
    """`--tf32 true`: fp32 training whose matrix products are TF32 ones (aiayn.device.allow_tf32),
    told in the run's first lines; a product then differs from IEEE fp32's by TF32's rounding."""
    from aiayn.cli import main

    before = torch.backends.cuda.matmul.fp32_precision
    try:
        code = main(["train", "--corpus", str(corpus_tsv), "--out", str(tmp_path / "run"), "--preset", "tiny",
                     "--vocab-size", "300", "--max-tokens", "1000", "--precision", "fp32", "--tf32", "true",
                     "--device", "cuda", "--max-steps", "5", "--log-every", "1", "--eval-every", "1000"])
        assert code in (0, None)
        out = capsys.readouterr().out
        assert "on cuda" in out and " in fp32 with TF32 products\n" in out, out
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        a, b = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
        tf32 = a @ b
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        ieee = a @ b
        # TF32 keeps 10 of fp32's 23 mantissa bits: its products differ, by about 2^-11 of their size.
        assert not torch.equal(tf32, ieee) and (tf32 - ieee).abs().max() < 2**-8 * ieee.abs().max()
        assert all(np.isfinite(loss) for loss in losses(tmp_path / "run").values())
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_a_torchrun_worker_refuses_another_gpu_than_its_own(monkeypatch):
    """NCCL's communicator is made on the GPU of the worker's LOCAL_RANK (init_distributed), so
    `--device cuda:N` naming another is refused in one line, before any GPU is touched."""
    from aiayn.device import rank_gpu

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"LOCAL_RANK \(cuda:0\), not cuda:1: give --device cuda"):
        rank_gpu(torch.device("cuda", 1))


def test_a_worker_takes_the_one_gpu_it_sees_or_that_of_its_local_rank(monkeypatch):
    """A launcher that gives each process a GPU of its own (SLURM's per-task CUDA_VISIBLE_DEVICES)
    leaves LOCAL_RANK counting the node's processes: the one GPU seen is cuda:0, whatever it says.
    Where several are seen, LOCAL_RANK picks one, and one past them is refused in a line."""
    from aiayn.device import local_gpu

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert local_gpu() == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert local_gpu() == 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"LOCAL_RANK is 3 but this process sees 2 GPU\(s\)"):
        local_gpu()


def test_a_command_leaves_the_process_group_it_joined_and_no_other(tmp_path):
    """After a command succeeds, the group init_distributed joined for it is destroyed (NCCL
    warns at exit of one left open); a group the caller made itself stays."""
    script = """
import torch.distributed as dist
from aiayn.device import init_distributed, leave_process_group
print(init_distributed("cpu"), end=" ")
leave_process_group()
print(dist.is_initialized(), end=" ")
dist.init_process_group("gloo")
leave_process_group()
print(dist.is_initialized())
"""
    with socket.socket() as s:  # the one process binds it at once, as rank 0 of its group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = environment(tmp_path, "cpu", TORCHELASTIC_RUN_ID="test", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(0,", "1)", "False", "True"]


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
@pytest.mark.parametrize("asked", [None, "strict", "warn-only"])
def test_the_compiled_step_keeps_deterministic_algorithms_as_strict_as_asked(asked, cpu):
    """aiayn.train_kernels.reproducible_compilation compiles a CPU step under deterministic algorithms,
    warn-only (an operation without one only warns), unless strict ones were asked for already
    (AIAYN_DETERMINISTIC=1): warn-only would give the fused attention's backward its atomics back
    on a GPU. A GPU step compiles under them only where strict ones were asked for. Afterwards
    the setting is as it was."""
    from aiayn.train_kernels import reproducible_compilation

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if asked:
            torch.use_deterministic_algorithms(True, warn_only=asked == "warn-only")
        outside = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        with reproducible_compilation(cpu=cpu):
            if cpu or asked == "strict":
                assert torch.are_deterministic_algorithms_enabled()
                assert torch.is_deterministic_algorithms_warn_only_enabled() == (asked != "strict")
            else:  # as it was outside
                assert (torch.are_deterministic_algorithms_enabled(),
                        torch.is_deterministic_algorithms_warn_only_enabled()) == outside
        assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == outside
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
