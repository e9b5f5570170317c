"""Training end to end: a copy task learnt in seconds, exact resume after SIGKILL, DDP = one
process with the combined batch, checkpoint averaging."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import checkpoint_dirs
from aiayn.config import ModelConfig, TrainConfig
from aiayn.model import Transformer
from aiayn.train import TrainData, Trainer
from aiayn.translate import translate_ids

COPY_MODEL = ModelConfig(vocab_size=20, d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.0, max_len=32)


def copy_pairs(count: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        length = int(torch.randint(3, 9, (1,), generator=g))
        ids = torch.randint(4, 20, (length,), generator=g).tolist()
        pairs.append((ids, list(ids)))
    return pairs


def test_copy_task_reaches_near_perfect_accuracy(tmp_path):
    recipe = TrainConfig(max_tokens=512, warmup_steps=100, lr_scale=0.5, max_steps=400, save_every=400,
                         log_every=50, eval_every=10_000, label_smoothing=0.0, seed=0)
    trainer = Trainer(COPY_MODEL, recipe, tmp_path / "run", TrainData(copy_pairs(2000, 0)), echo=lambda _: None)
    start = time.perf_counter()
    trainer.fit()
    assert time.perf_counter() - start < 120
    test = copy_pairs(200, 1)
    outputs = translate_ids(trainer.model, [s for s, _ in test])
    accuracy = sum(out == tgt for out, (_, tgt) in zip(outputs, test)) / len(test)
    assert accuracy >= 0.95, accuracy
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [50 * i for i in range(1, 9)]
    assert records[-1]["loss"] < records[0]["loss"] / 5
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000
    assert Transformer.load(tmp_path / "run" / "model").config == COPY_MODEL


# --- The command line: resume after SIGKILL, DDP, averaging -------------------------------

WORDS = "the a small big red blue cat dog bird fish sees likes eats finds near under over with".split()


@pytest.fixture(scope="module")
def corpus_tsv(tmp_path_factory):
    """A toy parallel corpus: the target is the source with its words in reverse order."""
    g = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(400):
        words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)]
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)))
    path = tmp_path_factory.mktemp("corpus") / "toy.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_argv(corpus, out, *extra):
    return [sys.executable, "-m", "aiayn", "train", "--preset", "tiny", "--vocab-size", "300", "--d-model", "32",
            "--d-ff", "64", "--corpus", str(corpus), "--out", str(out), "--max-tokens", "300", "--warmup-steps", "20",
            "--log-every", "1", "--eval-every", "1000", "--device", "cpu", "--seed", "3", *extra]


def losses(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def test_resume_after_sigkill_reaches_the_same_losses(tmp_path, corpus_tsv):
    steps = ["--max-steps", "60", "--save-every", "10"]
    done = subprocess.run(train_argv(corpus_tsv, tmp_path / "straight", *steps), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    reference = losses(tmp_path / "straight")
    assert sorted(reference) == list(range(1, 61))

    run = tmp_path / "killed"
    process = subprocess.Popen(train_argv(corpus_tsv, run, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "log.jsonl").exists() and max(losses(run), default=0) >= 25:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = max(losses(run))
    assert killed_at < 60 and len(checkpoint_dirs(run)) >= 2

    again = subprocess.run(train_argv(corpus_tsv, run, *steps, "--resume"), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout
    assert losses(run) == reference  # every step's loss, bit for bit

    # Without --resume an existing run is never overwritten.
    refused = subprocess.run(train_argv(corpus_tsv, run, *steps), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --resume" in refused.stderr and refused.stderr.count("\n") == 1


def test_two_gloo_processes_make_the_update_of_one_with_the_combined_batch(tmp_path, corpus_tsv):
    import socket

    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["--max-steps", "1", "--dropout", "0", "--save-every", "1"]
    single = subprocess.run(train_argv(corpus_tsv, tmp_path / "one", *common, "--accumulate", "2"),
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(port)]
    argv = train_argv(corpus_tsv, tmp_path / "two", *common)
    ddp = subprocess.run(launcher + argv[1:], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = load_file(str(tmp_path / "one" / "model" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6)
    assert losses(tmp_path / "one") == pytest.approx(losses(tmp_path / "two"), rel=1e-5)


def test_average_is_the_mean_of_the_last_checkpoints(tmp_path, corpus_tsv):
    from safetensors.torch import load_file

    done = subprocess.run(train_argv(corpus_tsv, tmp_path / "run", "--max-steps", "6", "--save-every", "2"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    averaged = subprocess.run([sys.executable, "-m", "aiayn", "average", str(tmp_path / "run"), "--last", "2",
                               "--out", str(tmp_path / "avg")], capture_output=True, text=True, timeout=120)
    assert averaged.returncode == 0, averaged.stderr
    last_two = [load_file(str(d / "model.safetensors")) for d in checkpoint_dirs(tmp_path / "run")[-2:]]
    mean = load_file(str(tmp_path / "avg" / "model.safetensors"))
    for name, value in mean.items():
        torch.testing.assert_close(value, (last_two[0][name] + last_two[1][name]) / 2)
    assert (tmp_path / "avg" / "tokenizer.model").exists()
