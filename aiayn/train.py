"""The training loop of §5: token-budget batches, Adam with warm-up, label smoothing, checkpoints.

One process trains on the CPU or one GPU; under `torchrun` every process takes its share of each
step's batches and DDP averages the gradients (gloo on CPU, NCCL on GPU). The loss of a step is
summed over all of its target tokens (on every rank, across accumulated batches) and divided by
their total count, so 2 processes × 1 batch make exactly the update of 1 process × 2 batches.

Nothing is lost to a crash: checkpoints are written atomically and hold the model, Adam's
moments, the RNG and the data position; a resumed run continues with the very same losses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from aiayn.checkpoint import (
    CHECKPOINTS, TOKENIZER_FILES, atomic_dir, atomic_write, checkpoint_dirs, copy_tokenizer, load_checkpoint,
    read_json, remove_litter, resolve_model_dir, run_lock, save_checkpoint, save_model, write_json,
)
from aiayn.config import ModelConfig, TrainConfig
from aiayn.data import BatchStream, collate, make_batches
from aiayn.device import autocast, check_precision, matmul_peak_flops, release_free_memory, resident_mib, resolve_device
from aiayn.flops import training_flops
from aiayn.kernels import Bf16Twin
from aiayn.loss import label_smoothed_nll
from aiayn.model import Transformer
from aiayn.optim import make_optimizer, noam_lr, set_lr
from aiayn.store import EncodedPairs, Store, as_encoded, load_store, preprocess, text_digest, tokenizer_digest, within_length

LOG = "log.jsonl"
# Seconds between hand-backs of the C heap's free memory (aiayn.device.release_free_memory): a
# trim walks the whole heap, too slow for every step.
RELEASE_SECONDS = 10.0
PLOT = "loss.png"
MODEL_CONFIG = "model_config.json"
TRAIN_CONFIG = "train_config.json"
FINAL = "model"  # RUN_DIR/model: the last weights as a model folder, with the tokenizer


@dataclass
class TrainData:
    """Encoded sentence pairs (ids without BOS/EOS; lists of pairs or `EncodedPairs`), and the
    dev text for BLEU."""

    train: Union[EncodedPairs, Sequence]
    dev: Union[EncodedPairs, Sequence] = ()
    dev_text: Sequence[tuple[str, str]] = ()  # (source, reference) strings of the dev pairs

    def __post_init__(self) -> None:
        self.train, self.dev = as_encoded(self.train), as_encoded(self.dev)


class StopSignals:
    """While active, SIGINT (Ctrl-C) and SIGTERM (a scheduler's notice) ask the loop to stop after
    the current step, so that a checkpoint is written before the process ends; a second Ctrl-C
    stops at once. Outside the main thread (no signals there) it does nothing."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self._previous: dict = {}

    @property
    def received(self) -> bool:
        return self.name is not None

    def _handle(self, signum: int, frame) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.name = signal.Signals(signum).name
        print(f"aiayn: {self.name}: stopping after this step and saving a checkpoint", file=sys.stderr, flush=True)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def init_distributed() -> tuple[int, int]:
    """(rank, world size), joining the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        _stop_with_launcher()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    return dist.get_rank(), world


def _stop_with_launcher() -> None:
    """A worker whose torchrun is killed (even by SIGKILL, which torchrun cannot pass on) gets
    SIGTERM, and stops as it does on any SIGTERM: after the step, with a checkpoint. Without
    this the workers would train on, unseen, into a folder the user thinks is free. Linux only
    (prctl PR_SET_PDEATHSIG); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the launcher was gone before the request took hold
        os.kill(os.getpid(), signal.SIGTERM)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the random draws (dropout) of one step on one rank, drawn afresh each step as
    fairseq does: a resumed run, on any number of processes, draws what an uninterrupted one
    would have drawn, with no generator state to save per rank, and no two ranks draw the same
    dropout masks."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint64)[0])


def load_run_configs(run_dir: Path) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configs a run was started with."""
    values = []
    for name in (MODEL_CONFIG, TRAIN_CONFIG):
        path = run_dir / name
        try:
            values.append(read_json(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{run_dir} is not a run folder: {name} is missing") from None
    try:
        return ModelConfig.from_dict(values[0]), TrainConfig.from_dict(values[1])
    except ValueError as error:
        raise ValueError(f"{run_dir}: {error}") from None


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """Never train over a run, a finished or interrupted one or an imported model, by accident.
    A folder that holds only a tokenizer (a start that failed) is not a run."""
    run_dir = Path(run_dir)
    if resume:
        if (run_dir / FINAL).exists() and not checkpoint_dirs(run_dir):
            raise ValueError(f"{run_dir} holds a model but no checkpoint to resume (an imported model?); "
                             f"fine-tune it with --init-from {run_dir} and another --out")
        return
    held = [name for name in (CHECKPOINTS, FINAL, LOG) if (run_dir / name).exists()]
    if held:
        raise ValueError(f"{run_dir} already holds a run ({held[0]}); pass --resume or choose another --out")


def read_log(path: Path, echo: Callable[[str], None] = print) -> list[dict]:
    """The records of a log.jsonl. A line that is not a JSON record (the last line cut short by a
    kill) is skipped with a note naming the file and line, so a run can always resume."""
    records = []
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a record with a step")
        except ValueError:
            echo(f"note: {path}, line {number} is not a log record (cut short?); skipped")
            continue
        records.append(record)
    return records


class Trainer:
    """Trains a `Transformer` on encoded pairs with the recipe of `train_config`, writing logs and
    checkpoints into `run_dir`; `resume` continues from the newest checkpoint there. The
    tokenizer, when given, is saved with the model and used for the dev BLEU."""

    def __init__(
        self,
        model_config: ModelConfig,
        train_config: TrainConfig,
        run_dir: str | Path,
        data: TrainData,
        tokenizer=None,
        resume: bool = False,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.config = model_config
        self.recipe = train_config
        self.run_dir = Path(run_dir)
        self.data = data
        self.tokenizer = tokenizer
        self.rank, self.world = init_distributed()
        self.echo = echo if self.rank == 0 else (lambda _: None)
        if len(data.train) == 0:
            raise ValueError("no training pairs left (all empty or longer than max_sentence_tokens?)")
        check_settings(model_config, train_config)
        self.device = resolve_device(train_config.device)
        if self.device.type == "cuda" and self.world > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if self.world > 1 and train_config.accumulate != 1 and self.rank == 0:
            self.echo(f"note: {self.world} processes × accumulate {train_config.accumulate} batches per step")

        torch.manual_seed(train_config.seed)
        self.model = Transformer(model_config).to(self.device)
        self.optimizer = make_optimizer(self.model, eps=train_config.adam_eps)
        c = model_config
        self.stream = BatchStream(
            data.train, train_config.max_tokens, train_config.seed, c.pad_id, c.bos_id, c.eos_id,
            shard=(self.rank, self.world),
        )
        self.step, self.elapsed, self.stopping = 0, 0.0, False
        check_run_dir(self.run_dir, resume)
        if self.rank == 0:
            for path in remove_litter(self.run_dir):
                self.echo(f"removed {path}, left by an interrupted write")
        if not self._restore_newest_intact():
            if train_config.init_from:
                self._start_from(resolve_model_dir(train_config.init_from))
            elif resume:
                self.echo(f"no checkpoint in {self.run_dir}: starting from scratch")
            self._keep_log_until(0)  # the steps of an earlier start are done again
        self.stream.epoch_batches()  # cut now, so that a step's time is the step's (4.5M pairs: ~1 s)
        self.scaler = torch.amp.GradScaler("cuda") if train_config.precision == "fp16" else None
        # bf16 weights: the step runs on a bf16 copy, the fp32 model stays the master (after any resume)
        self.twin = Bf16Twin(self.model) if train_config.bf16_weights else None
        if self.twin and self.world > 1:
            raise ValueError("bf16_weights trains in one process: its gradients would be summed across processes in bf16")
        self.net = self.twin.model if self.twin else self.model
        if self.world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        if train_config.compile:
            # Batches vary in shape (token budget, bucketing): compile for dynamic shapes once
            # rather than once per shape.
            self.net = torch.compile(self.net, dynamic=True)

    # -- state -----------------------------------------------------------------------------

    def _restore_newest_intact(self) -> bool:
        """Resume from the newest checkpoint that loads; one cut short by a crash (a full disk, a
        kill during fsync) is passed over with a warning for the one before it."""
        for checkpoint in reversed(checkpoint_dirs(self.run_dir)):
            try:
                state = load_checkpoint(checkpoint, self.model, self.optimizer)
                self.stream.load_state_dict(state["data"])
                self.step, self.elapsed = state["step"], state["elapsed"]
            except (ValueError, KeyError, TypeError) as error:
                self.echo(f"warning: skipping unreadable checkpoint {checkpoint}: {error}")
                continue
            self._keep_log_until(self.step)
            self.echo(f"resumed from {checkpoint} at step {self.step}")
            return True
        if checkpoint_dirs(self.run_dir):
            raise ValueError(f"no checkpoint in {self.run_dir / CHECKPOINTS} can be read; cannot resume")
        return False

    def _keep_log_until(self, step: int) -> None:
        """Drop the log records after `step`: those steps are about to be trained again, and a log
        never holds one step twice."""
        log = self.run_dir / LOG
        if self.rank == 0 and log.exists():
            kept = [r for r in read_log(log, self.echo) if r["step"] <= step]
            _atomic_text(log, "".join(json.dumps(r) + "\n" for r in kept))

    def _start_from(self, model_dir: Path) -> None:
        """Fine-tuning: the weights of a trained or imported model instead of random ones."""
        trained = Transformer.load(model_dir, self.device)
        if trained.config != dataclasses.replace(self.config, dropout=trained.config.dropout,
                                                  attention_dropout=trained.config.attention_dropout):
            raise ValueError(f"{model_dir} holds another model shape than this run's; only dropout may change")
        self.model.load_state_dict(trained.state_dict())
        self.echo(f"starting from the weights of {model_dir}")

    def _save(self) -> None:
        if self.rank != 0:
            return
        state = {"elapsed": self.elapsed, "data": self.stream.state_dict()}
        save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state, self.recipe.keep_last)

    def _log(self, record: dict) -> None:
        if self.rank != 0:
            return
        with open(self.run_dir / LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    # -- one optimiser step ----------------------------------------------------------------

    def _train_step(self, stop_requested: bool = False) -> tuple[float, float, int, float]:
        """Returns (summed smoothed loss, summed NLL, target tokens, model FLOPs) over all ranks.
        A stop asked for on any rank (`stop_requested`) makes every rank stop after this step."""
        batches = [next(self.stream) for _ in range(self.recipe.accumulate)]
        local = torch.tensor([float(sum(b.n_tgt_tokens for b in batches)), float(stop_requested)])
        if self.world > 1:
            dist.all_reduce(local)
        n_tokens, stops = local.tolist()
        self.stopping = stops > 0
        set_lr(self.optimizer, noam_lr(self.step + 1, self.config.d_model, self.recipe.warmup_steps, self.recipe.lr_scale))
        torch.manual_seed(step_seed(self.recipe.seed, self.rank, self.step))
        totals = torch.zeros(2)
        flops = 0.0
        for i, batch in enumerate(batches):
            # Only the last batch of a step all-reduces the gradients.
            last = i == len(batches) - 1
            context = self.net.no_sync() if self.world > 1 and not last else contextlib.nullcontext()
            with context:
                batch = batch.to(self.device, non_blocking=True)
                src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
                # bf16 weights compute in bf16 as they are; otherwise autocast casts for fp32 weights
                with contextlib.nullcontext() if self.twin else autocast(self.device, self.recipe.precision):
                    logits = self.net(src, tgt_in)  # (B, T, V)
                loss, nll = label_smoothed_nll(logits, tgt_out, self.recipe.label_smoothing, self.config.pad_id)
                # DDP averages gradients over ranks; × world makes it a sum over all tokens.
                scaled = loss * (self.world / n_tokens)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            if self.twin:  # summed in the fp32 master, batch by batch
                self.twin.grads_to_master()
            totals += torch.stack([loss.detach().float().cpu(), nll.detach().float().cpu()])
            rows = src.size(0)
            flops += rows * training_flops(self.config, batch.n_src_tokens / rows, batch.n_tgt_tokens / rows)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.twin:
            self.twin.weights_from_master()
        self.step += 1
        if self.world > 1:
            dist.all_reduce(totals)
        return totals[0].item(), totals[1].item(), int(n_tokens), flops * self.world

    # -- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict:
        """Dev loss and perplexity over every dev pair; BLEU of greedy translations of the first
        `eval_bleu_sentences` dev sentences (beam search is for the final test)."""
        from aiayn.evaluate import bleu
        from aiayn.translate import translate_ids

        self.model.eval()
        c = self.config
        loss_sum = nll_sum = tokens = 0.0
        for indices in make_batches(self.data.dev.lengths + 1, self.recipe.max_tokens, 0, 0):
            batch = collate([self.data.dev[i] for i in indices], c.pad_id, c.bos_id, c.eos_id)
            with autocast(self.device, self.recipe.precision):
                logits = self.model(batch.src.to(self.device), batch.tgt_in.to(self.device))
            loss, nll = label_smoothed_nll(logits, batch.tgt_out.to(self.device), self.recipe.label_smoothing, c.pad_id)
            loss_sum, nll_sum, tokens = loss_sum + loss.item(), nll_sum + nll.item(), tokens + batch.n_tgt_tokens
        record = {"step": self.step, "split": "dev", "loss": loss_sum / tokens, "ppl": math.exp(nll_sum / tokens)}
        count = min(self.recipe.eval_bleu_sentences, len(self.data.dev_text))
        if self.tokenizer is not None and count:
            sources = [self.data.dev[i][0].tolist() for i in range(count)]
            outputs = translate_ids(self.model, sources, beam=1, precision=self.recipe.precision)
            hypotheses = [self.tokenizer.decode(ids) for ids in outputs]
            record["bleu"] = bleu(hypotheses, [r for _, r in self.data.dev_text[:count]])[0]
        self.model.train()
        return record

    # -- the loop --------------------------------------------------------------------------

    def fit(self) -> dict:
        """Train until `max_steps` or `minutes`; returns the last training record."""
        from tqdm.auto import tqdm

        recipe = self.recipe
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            write_json(self.run_dir / TRAIN_CONFIG, dataclasses.asdict(recipe))
            write_json(self.run_dir / MODEL_CONFIG, self.config.to_dict())
        peak = matmul_peak_flops(self.device, recipe.precision)
        budget = recipe.minutes * 60 if recipe.minutes else math.inf
        self.model.train()
        bar = tqdm(total=recipe.max_steps, initial=self.step, desc="train", unit="step",
                   disable=self.rank != 0 or not sys.stderr.isatty(), dynamic_ncols=True)
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "flops": 0.0, "seconds": 0.0}
        last_save_time = last_release_time = time.monotonic()
        record: dict = {}
        with StopSignals() as signals:
            while self.step < recipe.max_steps and self.elapsed < budget and not self.stopping:
                record = self._step_and_report(signals, window, peak, budget, bar) or record
                if time.monotonic() - last_release_time >= RELEASE_SECONDS:  # bounds the resident set
                    release_free_memory()
                    last_release_time = time.monotonic()
                due = recipe.save_minutes is not None and time.monotonic() - last_save_time >= recipe.save_minutes * 60
                if self.step % recipe.save_every == 0 or due:
                    self._save()
                    last_save_time = time.monotonic()
            bar.close()
            if not checkpoint_dirs(self.run_dir) or checkpoint_dirs(self.run_dir)[-1].name != f"step_{self.step:08d}":
                self._save()
            if self.rank == 0:
                atomic_dir(self.run_dir / FINAL, self._save_final, force=True)
                self.plot()
            if self.world > 1:
                dist.barrier()
        if self.stopping:
            self.echo(f"stopped by {signals.name} at step {self.step}; checkpoint saved in "
                      f"{self.run_dir / CHECKPOINTS}; continue with --resume")
            raise KeyboardInterrupt
        return record

    def _save_final(self, folder: Path) -> None:
        save_model(self.model, folder)
        if self.tokenizer is not None:
            self.tokenizer.save(folder)

    def _step_and_report(self, signals: "StopSignals", window: dict, peak: float, budget: float, bar) -> Optional[dict]:
        """One optimiser step, then its progress bar, validation and log; returns the training
        record when one is logged. `window` sums the step's figures since the last record."""
        recipe = self.recipe
        record = None
        start = time.perf_counter()
        loss, nll, tokens, flops = self._train_step(signals.received)
        seconds = time.perf_counter() - start
        self.elapsed += seconds
        for key, value in zip(("loss", "nll", "tokens", "flops", "seconds"), (loss, nll, tokens, flops, seconds)):
            window[key] += value
        bar.update(1)
        last = self.step == recipe.max_steps or self.elapsed >= budget or self.stopping
        if self.step % recipe.log_every == 0 or last:
            record = {
                "step": self.step, "split": "train",
                "loss": window["loss"] / window["tokens"], "ppl": math.exp(window["nll"] / window["tokens"]),
                "lr": self.optimizer.param_groups[0]["lr"],
                "tokens_per_s": window["tokens"] / window["seconds"],
                "mfu": window["flops"] / window["seconds"] / (peak * self.world),
                "elapsed_s": round(self.elapsed, 1),
                "rss_mib": resident_mib(),  # the process's memory over a long run (docs/robustness.md)
            }
            self._log(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", ppl=f"{record['ppl']:.1f}", lr=f"{record['lr']:.2e}",
                            tok_s=f"{record['tokens_per_s']:.0f}")
            if bar.disable:
                self.echo(f"step {self.step}: loss {record['loss']:.3f} ppl {record['ppl']:.1f} lr {record['lr']:.2e} "
                          f"{record['tokens_per_s']:.0f} tok/s MFU {record['mfu']:.1%}")
            for key in window:
                window[key] = 0.0
        if self.data.dev and self.step % recipe.eval_every == 0 and self.rank == 0 and not self.stopping:
            dev = self.validate()
            self._log(dev)
            self.echo("validation: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in dev.items()))
            self.plot()
        return record

    def plot(self) -> None:
        """RUN_DIR/loss.png: training and dev loss against the step."""
        if self.rank == 0:
            plot_log(self.run_dir / LOG, self.run_dir / PLOT)


def plot_log(log_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not log_path.exists():
        return
    records = read_log(log_path, echo=lambda _: None)
    fig, ax = plt.subplots(figsize=(7, 4))
    for split, style in (("train", "-"), ("dev", "o-")):
        points = [(r["step"], r["loss"]) for r in records if r.get("split") == split]
        if points:
            ax.plot(*zip(*points), style, label=f"{split} loss")
    ax.set_xlabel("step")
    ax.set_ylabel("label-smoothed loss per target token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = png_path.with_name(f".{png_path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)


def _atomic_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


RUN_DATA = "data"  # RUN_DIR/data: the corpus preprocessed for a run started from --corpus


def prepare_data(
    model_config: ModelConfig, recipe: TrainConfig, run_dir: Path, echo: Callable[[str], None] = print,
) -> tuple[object, TrainData, Store]:
    """The run's data, memory-mapped: `--data DATA_DIR` as it is, else the corpus spec
    preprocessed into RUN_DIR/data first (by rank 0; the other ranks wait), so `--corpus` runs
    train exactly as `--data` runs do. The run folder gets the data's tokenizer.

    Returns (tokenizer, TrainData, Store). Pairs longer than `max_sentence_tokens` (either side,
    with BOS/EOS) are left out and counted, never silently dropped.
    """
    from aiayn.tokenizer import load_tokenizer

    run_dir = Path(run_dir)
    rank, world = init_distributed()
    data_dir = Path(recipe.data) if recipe.data else run_dir / RUN_DATA
    failure = None
    if rank == 0:
        try:  # a rank-0 error must reach the others, or they wait at the barrier forever
            if not recipe.data:
                _preprocess_for_run(model_config, recipe, run_dir, echo)
            _give_run_the_tokenizer(load_store(data_dir), recipe, run_dir, echo)
        except (ValueError, OSError, ImportError) as error:
            failure = error
    if world > 1:
        flag = [failure is not None]
        dist.broadcast_object_list(flag, src=0)
        if flag[0] and failure is None:
            raise SystemExit(1)  # rank 0 reports the error
    if failure is not None:
        raise failure
    store = load_store(data_dir)
    _check_data_settings(store, model_config, recipe)
    tokenizer = load_tokenizer(run_dir)
    kept, dev_text = {}, []
    for name in ("train", "dev"):
        pairs = store.split(name)
        rows = within_length(pairs.lengths, recipe.max_sentence_tokens)  # (kept,)
        if len(rows) < len(pairs):
            echo(f"{name}: left out {len(pairs) - len(rows):,} of {len(pairs):,} pairs longer than "
                 f"max_sentence_tokens={recipe.max_sentence_tokens}")
            pairs = pairs.subset(rows)
        kept[name] = pairs
        if name == "dev" and len(rows):
            texts = store.texts("dev")
            dev_text = [texts[i] for i in rows.tolist()]
    counts = ", ".join(f"{name} {info['pairs']:,} pairs" for name, info in store.manifest["splits"].items())
    echo(f"data {data_dir} ({store.manifest['corpus']}, {store.src_lang}→{store.tgt_lang}): {counts}")
    return tokenizer, TrainData(kept["train"], kept["dev"], dev_text), store


def _preprocess_for_run(model_config: ModelConfig, recipe: TrainConfig, run_dir: Path,
                        echo: Callable[[str], None]) -> None:
    """RUN_DIR/data for a run from a corpus spec: kept when the run has checkpoints (they were
    trained on it) or when it was made from this very corpus and settings (a start that failed
    later); otherwise made anew."""
    from aiayn.data import stream_corpus
    from aiayn.tokenizer import has_tokenizer

    data_dir = run_dir / RUN_DATA
    try:
        manifest = load_store(data_dir).manifest
    except (ValueError, OSError):
        manifest = None
    trained = bool(checkpoint_dirs(run_dir))
    if manifest is not None and trained:
        if (manifest["corpus"], manifest["vocab_size"]) != (recipe.corpus, model_config.vocab_size):
            echo(f"warning: this run was trained on {manifest['corpus']} ({data_dir}); the resumed run keeps it")
        return
    init_from = resolve_model_dir(recipe.init_from) if recipe.init_from else None
    # A run trained before RUN_DIR/data existed keeps its tokenizer: its checkpoints use its ids.
    tokenizer_from = init_from or (run_dir if trained and has_tokenizer(run_dir) else None)
    corpus = stream_corpus(recipe.corpus, recipe.src_lang, recipe.tgt_lang)
    echo(f"corpus {corpus.name} ({corpus.src_lang}→{corpus.tgt_lang}), preprocessed into {data_dir}")
    if manifest is not None:
        wanted = {"corpus": recipe.corpus, "vocab_size": model_config.vocab_size,
                  "max_sentence_tokens": recipe.max_sentence_tokens,
                  "tokenizer_from": str(tokenizer_from) if tokenizer_from else None,
                  "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang}
        if all(manifest.get(key) == value for key, value in wanted.items()) \
                and manifest["splits"]["train"]["text_sha256"] == text_digest(corpus):
            return
        echo(f"note: {data_dir} was made from other data or settings; making it again")
    preprocess(corpus, data_dir, model_config.vocab_size, spec=recipe.corpus, tokenizer_from=tokenizer_from,
               max_sentence_tokens=recipe.max_sentence_tokens, force=True, echo=echo)


def _give_run_the_tokenizer(store: Store, recipe: TrainConfig, run_dir: Path, echo: Callable[[str], None]) -> None:
    """Copy the data's tokenizer into the run folder (it goes with every model saved), unless
    the run has one already: then it must be the same, or the ids would mean other words."""
    from aiayn.tokenizer import has_tokenizer

    if recipe.init_from and tokenizer_digest(resolve_model_dir(recipe.init_from)) != store.manifest["tokenizer_sha256"]:
        raise ValueError(f"{store.folder} was not encoded with the tokenizer of {recipe.init_from}; "
                         f"make it with: aiayn preprocess --tokenizer {recipe.init_from} ...")
    if has_tokenizer(run_dir) and tokenizer_digest(run_dir) != store.manifest["tokenizer_sha256"]:
        if checkpoint_dirs(run_dir):
            raise ValueError(f"{store.folder} was encoded with another tokenizer than the one this run was trained "
                             f"with ({run_dir}); resume with the data it was trained on")
        echo(f"note: replacing the tokenizer in {run_dir}, left by an earlier start, with the one of {store.folder}")
        for name in TOKENIZER_FILES:
            (run_dir / name).unlink(missing_ok=True)
    if not has_tokenizer(run_dir):
        copy_tokenizer(store.folder, run_dir)


def _check_data_settings(store: Store, model_config: ModelConfig, recipe: TrainConfig) -> None:
    if store.manifest["vocab_size"] != model_config.vocab_size:
        raise ValueError(f"the tokenizer of {store.folder} has {store.manifest['vocab_size']} tokens but the model's "
                         f"vocab_size is {model_config.vocab_size}; pass --vocab-size {store.manifest['vocab_size']}")
    for given, kept, side in ((recipe.src_lang, store.src_lang, "source"), (recipe.tgt_lang, store.tgt_lang, "target")):
        if recipe.data and given is not None and given != kept:
            raise ValueError(f"{store.folder} has {kept} as its {side} language, not {given}")


def check_settings(model_config: ModelConfig, recipe: TrainConfig) -> None:
    """Mistakes that would otherwise surface only after the corpus is read and a tokenizer
    trained: a device that is not here, fp16 on a CPU, sentences longer than learned positions."""
    check_precision(resolve_device(recipe.device), recipe.precision)
    if model_config.positional == "learned" and recipe.max_sentence_tokens + 1 > model_config.max_len:
        raise ValueError(f"max_sentence_tokens={recipe.max_sentence_tokens} needs {recipe.max_sentence_tokens + 1} "
                         f"learned positions (with BOS/EOS) but max_len is {model_config.max_len}; "
                         f"lower --max-sentence-tokens or raise --max-len")


def train_run(
    model_config: ModelConfig, recipe: TrainConfig, run_dir: Path, resume: bool = False,
    echo: Callable[[str], None] = print,
) -> tuple[Trainer, Store]:
    """Everything `aiayn train` does: preprocess the corpus (or open --data), train. Returns
    the trainer (its model holds the last weights) and the data store."""
    check_settings(model_config, recipe)
    rank, _ = init_distributed()
    echo = echo if rank == 0 else (lambda *_: None)
    # Rank 0 writes the run folder, and holds its lock until the run ends.
    with run_lock(run_dir) if rank == 0 else contextlib.nullcontext():
        check_run_dir(run_dir, resume)
        tokenizer, data, store = prepare_data(model_config, recipe, run_dir, echo)
        trainer = Trainer(model_config, recipe, run_dir, data, tokenizer, resume=resume, echo=echo)
        echo(f"model: {model_config.n_layers}+{model_config.n_layers} layers, d_model {model_config.d_model}, "
             f"{trainer.model.num_parameters():,} parameters, on {trainer.device} in {recipe.precision}")
        last = trainer.fit()
        echo(f"done at step {trainer.step} after {trainer.elapsed / 60:.1f} min"
             + (f": loss {last['loss']:.3f}, ppl {last['ppl']:.2f}" if last else "")
             + f"; model in {run_dir / FINAL}")
    return trainer, store
