"""The training of §5: a pure training step, and the loop that runs it over a run folder.

`TrainStep` is one optimiser update and nothing else (forward, the label-smoothed loss of §5.4,
backward, Adam's step of §5.3): the Trainer and the benchmarks call the same one. `Trainer` is
the loop around it: token-budget batches, the learning-rate schedule, validation, the log and
checkpoints in a `RunDir`.

One process trains on the CPU or one GPU; under `torchrun` every process takes its share of each
step's batches and DDP averages the gradients (gloo on CPU, NCCL on GPU), even where torchrun
starts one process: that one trains by the code of many. The loss of a step is summed over all of
its target tokens (on every rank, across accumulated batches) and divided by their total count, so
2 processes × 1 batch make exactly the update of 1 process × 2 batches.

Nothing is lost to a crash: checkpoints are written atomically and hold the model, Adam's
moments and the data position; a resumed run continues with the very same losses."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from aiayn.batching import Batch, BatchStream, check_tokens, collate, make_batches, to_device
from aiayn.checkpoint import load_checkpoint
from aiayn.config import DECODE_PRESETS, ModelConfig, TrainConfig
from aiayn.device import (DETERMINISTIC, allow_tf32, autocast, deterministic_from_environment,
                          init_distributed, keep_freed_memory, matmul_peak_flops, process_group_joined, rank_gpu,
                          resident_mib, resolve_device, sum_over_ranks)
from aiayn.errors import Terminated
from aiayn.evaluate import score_hypotheses
from aiayn.flops import memory_warning, training_flops
from aiayn.train_kernels import Bf16Twin, compiled_graphs, fp32_linears, reproducible_compilation
from aiayn.loss import label_smoothed_nll, perplexity
from aiayn.model import Transformer
from aiayn.optim import make_optimizer, noam_lr, set_lr
from aiayn.prepare import TrainData, check_settings, prepare_data
from aiayn.run import RunDir, resolve_model_dir
from aiayn.store import Store
from aiayn.translate import Translator


RESUME_HINT = "continue with --resume"  # what a run stopped by a signal says
RERUN_HINT = "rerun the same command to continue"  # ... in a command that takes no --resume (demo, table3)
# Dev sentences a validation translates between two looks at a stop signal: a few seconds' work
# for the demo's model on a CPU, where the whole BLEU pass could take minutes.
VALIDATION_CHUNK = 64


class TrainStep:
    """One optimiser update (§5.3, §5.4) of `model` on a list of batches, whatever the loop
    around it: each batch's forward (under bf16/fp16 autocast, or on a bf16 copy of the weights
    with `bf16_weights`), its label-smoothed loss summed over its target tokens and divided by
    the step's `n_tokens`, its backward; then Adam's step. In a process group (torchrun, of any
    size) the model is wrapped in DDP and only the last batch all-reduces the gradients. The
    learning rate and the random seed are the caller's to set."""

    def __init__(self, model: Transformer, optimizer: torch.optim.Optimizer, recipe: TrainConfig,
                 device: torch.device) -> None:
        world = dist.get_world_size() if process_group_joined() else 1  # scales the loss (DDP averages)
        self.model, self.optimizer, self.world = model, optimizer, world
        self.precision, self.label_smoothing, self.pad_id = recipe.precision, recipe.label_smoothing, model.config.pad_id
        self.device = device
        if device.type == "cpu":
            keep_freed_memory()  # a step's large activations reuse the last step's pages
        # fp16's loss scale, which checkpoints keep (`Trainer.loss_scale`): a resumed run would
        # otherwise start again at 65536 and skip steps to overflow while it halves back down.
        self.scaler = torch.amp.GradScaler(device.type) if recipe.precision == "fp16" else None
        # bf16 weights: the step runs on a bf16 copy, the fp32 model stays the master
        self.twin = Bf16Twin(model) if recipe.bf16_weights else None
        if self.twin and world > 1:
            raise ValueError("bf16_weights trains in one process: its gradients would be summed across processes in "
                             "bf16; give --bf16-weights false to train in several")
        self.net = self.twin.model if self.twin else model
        # A bf16 copy trains in one process (refused above for more), so there is nothing to reduce.
        self.ddp = process_group_joined() and not self.twin
        if self.ddp:
            self.net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        self.compiled = recipe.compile
        self.compiles, self.compile_seconds = 0, 0.0  # graphs compiled, and the seconds of the steps that compiled them
        if recipe.compile:
            # Batches vary in shape (token budget, bucketing): one graph with symbolic sizes
            # rather than one per shape (a size of 1 may add one). `fallback_random`: dropout's
            # draws come from torch's generator, as in the eager step (aiayn.kernels.Dropout).
            # The loss stays outside, as aiayn.kernels.log_softmax_stats already computes it
            # a cache-sized chunk at a time.
            self.net = torch.compile(self.net, dynamic=True, options={"fallback_random": True})

    def __call__(self, batches: Sequence[Batch], n_tokens: float) -> Tensor:
        """Returns (summed smoothed loss, summed NLL) of this rank's batches, in fp32 on the CPU."""
        if not self.compiled:
            return self._step(batches, n_tokens).cpu()
        before, start = compiled_graphs(), time.perf_counter()
        with reproducible_compilation(cpu=self.device.type == "cpu"):
            totals = self._step(batches, n_tokens).cpu()
        if made := compiled_graphs() - before:
            self.compiles, self.compile_seconds = self.compiles + made, self.compile_seconds + time.perf_counter() - start
        return totals

    def _step(self, batches: Sequence[Batch], n_tokens: float) -> Tensor:
        """Queues the step's batches without reading anything back from the device."""
        totals = torch.zeros(2, device=self.device)
        for i, batch in enumerate(batches):
            context = self.net.no_sync() if self.ddp and i < len(batches) - 1 else contextlib.nullcontext()
            with context:
                # On the host, where they cost the device no sync: the ids' range, and the target
                # positions that hold a token (padding gets no logits: the projection and loss skip it).
                check_tokens("src", batch.src, self.model.config.vocab_size)
                check_tokens("tgt", batch.tgt_in, self.model.config.vocab_size)
                flat = batch.tgt_out.flatten()  # (B·T,)
                positions = (flat != self.pad_id).nonzero().squeeze(1)  # (N,)
                target = to_device(flat[positions], self.device, non_blocking=True)  # (N,)
                positions = to_device(positions, self.device, non_blocking=True)
                batch = batch.to(self.device, non_blocking=True)
                precision = contextlib.nullcontext() if self.twin else autocast(self.device, self.precision)  # bf16 weights: as they are
                with precision, fp32_linears(self.device, self.precision, self.compiled):
                    logits = self.net(batch.src, batch.tgt_in, positions, check_range=False)  # (N, V)
                loss, nll = label_smoothed_nll(logits, target, self.label_smoothing, self.pad_id)
                # DDP averages gradients over ranks; × world makes it a sum over all tokens.
                scaled = loss * (self.world / n_tokens)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            if self.twin:  # summed in the fp32 master, batch by batch
                self.twin.grads_to_master()
            totals += torch.stack([loss.detach().float(), nll.detach().float()])
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.twin:
            self.twin.weights_from_master()
        return totals


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


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the random draws (dropout) of one step on one rank, drawn afresh each step as
    fairseq does: a resumed run, on any number of processes, draws what an uninterrupted one
    would have, with no generator state to save per rank, and no two ranks draw the same masks."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint64)[0])


class Trainer:
    """Trains a `Transformer` on encoded pairs with the recipe of `train_config`, writing logs and
    checkpoints into the run folder `run`; `resume` continues from its newest checkpoint. The
    tokenizer, when given, is saved with the model and used for the dev BLEU."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, run: Union[RunDir, str, Path],
                 data: TrainData, tokenizer=None, resume: bool = False, echo: Callable[[str], None] = print) -> None:
        self.config = model_config
        self.recipe = train_config
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.data = data
        self.tokenizer = tokenizer
        self.rank, self.world = init_distributed(train_config.device)
        self.distributed = process_group_joined()  # torchrun's, of any size
        self.echo = echo if self.rank == 0 else (lambda _: None)
        if self.distributed:
            self.echo(f"process group: {dist.get_backend()}, {self.world} process{'es' if self.world > 1 else ''}")
        if deterministic_from_environment():
            self.echo(f"{DETERMINISTIC}=1: deterministic algorithms only")
        if len(data.train) == 0:
            raise ValueError("no training pairs left (all empty or longer than max_sentence_tokens?)")
        check_settings(model_config, train_config)
        self.device = self._device()
        torch.manual_seed(train_config.seed)
        self.model = Transformer(model_config).to(self.device)
        self.optimizer = make_optimizer(self.model, eps=train_config.adam_eps)
        c = model_config
        self.stream = BatchStream(
            data.train, train_config.max_tokens, train_config.seed, c.pad_id, c.bos_id, c.eos_id,
            shard=(self.rank, self.world),
        )
        self.step, self.elapsed, self.stopping = 0, 0.0, False
        self.loss_scale: Optional[dict] = None  # fp16's GradScaler state, from a checkpoint
        # Sums since the last log boundary, in checkpoints: a resumed run logs as one uninterrupted (found in review)
        self.window = dict.fromkeys(("loss", "nll", "tokens", "flops", "seconds"), 0.0)
        self.compiles_told = 0  # graphs of the compiled step reported so far
        self.resume_hint = RESUME_HINT  # what a stopped run says (demo, experiment: rerun the command)
        self.run.check_start(resume)
        if self.rank == 0:
            for path in self.run.remove_litter():
                self.echo(f"removed {path}, left by an interrupted write")
        if not self._restore_newest_intact():
            if train_config.init_from:
                self._start_from(resolve_model_dir(train_config.init_from))
            elif resume:
                self.echo(f"no checkpoint in {self.run.path}: starting from scratch")
            self._keep_log_until(0)  # the steps of an earlier start are done again
        self.stream.epoch_batches()  # cut now, so that a step's time is the step's (4.5M pairs: ~1 s)
        self.train_step = TrainStep(self.model, self.optimizer, train_config, self.device)  # after any resume
        if self.train_step.scaler and self.loss_scale:
            self.train_step.scaler.load_state_dict(self.loss_scale)

    def _device(self) -> torch.device:
        device = resolve_device(self.recipe.device)
        if device.type == "cuda" and self.distributed:
            device = rank_gpu(device)
        if self.recipe.tf32:
            allow_tf32(device)
        if self.world > 1 and self.recipe.accumulate != 1:
            self.echo(f"note: {self.world} processes × accumulate {self.recipe.accumulate} batches per step")
        return device

    # -- state -----------------------------------------------------------------------------

    def _restore_newest_intact(self) -> bool:
        """Resume from the newest checkpoint that loads; one cut short by a crash (a full disk, a
        kill during fsync) is passed over with a warning for the one before it."""
        skipped = []
        for checkpoint in reversed(self.run.checkpoints()):
            try:
                state = load_checkpoint(checkpoint, self.model, self.optimizer)
                if moved := self.stream.load_state_dict(state["data"]):
                    self.echo(f"note: {moved}")
                self.step, self.elapsed = state["step"], state["elapsed"]
                self.window.update(state.get("window", {}))  # (none in checkpoints of before)
                self.loss_scale = state.get("loss_scale")  # fp16's, for the TrainStep made after this
            except (ValueError, KeyError, TypeError, FileNotFoundError) as error:  # (another rank set it aside)
                skipped.append(checkpoint)
                self.echo(f"warning: skipping unreadable checkpoint {checkpoint}: {error}")
                continue
            # Those passed over are set aside, out of the checkpoints: as the newest, every rotation
            # kept them and deleted the good ones the run saved (found in review: none was left).
            for unreadable in skipped:
                if self.rank == 0 and unreadable.exists():
                    aside = next(name for n in itertools.count(1) if not unreadable.with_name(
                        name := f"unreadable{'' if n == 1 else n}-{unreadable.name}").exists())
                    unreadable.rename(unreadable.with_name(aside))
                    self.echo(f"note: {unreadable.name} is now {aside}")
            self._keep_log_until(self.step)
            self.echo(f"resumed from {checkpoint} at step {self.step}")
            return True
        if skipped:
            raise ValueError(f"no checkpoint in {self.run.checkpoint_root} can be read; cannot resume")
        return False

    def _keep_log_until(self, step: int) -> None:
        if self.rank == 0:
            self.run.keep_log_until(step, self.echo)

    def _start_from(self, model_dir: Path) -> None:
        """Fine-tuning: the weights of a trained or imported model instead of random ones."""
        trained = Transformer.load(model_dir, self.device)
        if trained.config != dataclasses.replace(self.config, dropout=trained.config.dropout,
                                                  attention_dropout=trained.config.attention_dropout):
            raise ValueError(f"{model_dir} holds another model shape than this run's; only dropout may change")
        self.model.load_state_dict(trained.state_dict())
        self.echo(f"starting from the weights of {model_dir}")

    def _diverged(self, what: str, by_loss: bool = False) -> FloatingPointError:
        """The error that ends a run whose loss (`by_loss`) or weights are no longer finite, raised
        before anything of it is saved: a diverged checkpoint would rotate the good ones out (found
        in review). A checkpoint whose weights gave that loss is moved out of --resume's way."""
        gave_it = self.run.checkpoint(self.step - 1)
        if by_loss and self.rank == 0 and gave_it.is_dir():
            gave_it.rename(gave_it.with_name(f"diverged-{gave_it.name}"))
            what += f" (from the weights of {gave_it.name}, now diverged-{gave_it.name})"
        kept = self.run.checkpoints()
        before = f"the newest checkpoint is {kept[-1].name}" if kept else "no checkpoint is left to resume from"
        return FloatingPointError(f"training diverged at step {self.step}: {what}; nothing of it was saved ({before}): "
                                  "--resume with a smaller --lr-scale or a longer --warmup-steps")

    def _save(self) -> None:
        if not torch.stack([p.isfinite().all() for p in self.model.parameters()]).all():  # the same on every rank
            raise self._diverged("its weights are no longer finite")
        if self.rank == 0:
            state = {"elapsed": self.elapsed, "data": self.stream.state_dict(), "window": dict(self.window)}
            if self.train_step.scaler:
                state["loss_scale"] = self.train_step.scaler.state_dict()
            self.run.save_checkpoint(self.step, self.model, self.optimizer, state, self.recipe.keep_last)

    def _log(self, record: dict) -> None:
        if self.rank == 0:
            self.run.append_log(record)

    # -- one optimiser step ----------------------------------------------------------------

    def _train_step(self, signals: "StopSignals") -> tuple[float, float, int, float, float]:
        """Returns (summed smoothed loss, summed NLL, target tokens, model FLOPs, seconds) over all
        ranks. Its end agrees the ranks' stop: a signal on any rank stops all after this step, and
        each counts the ranks' mean seconds against --minutes (found in review: a stop ran one
        more step; ranks that counted their own time left the loop apart, one hanging)."""
        start = time.perf_counter()
        batches = [next(self.stream) for _ in range(self.recipe.accumulate)]
        n_tokens = sum_over_ranks(torch.tensor([float(sum(b.n_tgt_tokens for b in batches))]), self.device).item()
        set_lr(self.optimizer, noam_lr(self.step + 1, self.config.d_model, self.recipe.warmup_steps, self.recipe.lr_scale))
        torch.manual_seed(step_seed(self.recipe.seed, self.rank, self.step))
        totals = self.train_step(batches, n_tokens)
        flops = sum(b.src.size(0) * training_flops(self.config, b.n_src_tokens / b.src.size(0), b.n_tgt_tokens / b.src.size(0))
                    for b in batches)
        self.step += 1
        ends = torch.tensor([float(signals.received), time.perf_counter() - start])
        loss, nll, stops, seconds = sum_over_ranks(torch.cat([totals, ends]), self.device).tolist()
        self.stopping = stops > 0
        if not math.isfinite(loss):  # the same sum on every rank: every rank stops here
            raise self._diverged(f"its loss is {loss}", by_loss=True)
        return loss, nll, int(n_tokens), flops * self.world, seconds / self.world

    # -- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, stop: Callable[[], bool] = lambda: False) -> Optional[dict]:
        """Dev loss and perplexity over every dev pair; BLEU and chrF of greedy translations of the
        first `eval_bleu_sentences` dev sentences (beam search is for the final test). None where
        `stop()` turned true between batches (found in review: a SIGINT during a long BLEU pass
        waited minutes for it, longer than a scheduler's grace period)."""
        try:
            self.model.eval()
            return self._validate(stop)
        finally:
            self.model.train()

    def _validate(self, stop: Callable[[], bool]) -> Optional[dict]:
        c = self.config
        loss_sum = nll_sum = tokens = 0.0
        for indices in make_batches(self.data.dev.lengths + 1, self.recipe.max_tokens, 0, 0):
            if stop():
                return None
            batch = collate([self.data.dev[i] for i in indices], c.pad_id, c.bos_id, c.eos_id)
            with autocast(self.device, self.recipe.precision), fp32_linears(self.device, self.recipe.precision):
                logits = self.model(batch.src.to(self.device), batch.tgt_in.to(self.device))
            loss, nll = label_smoothed_nll(logits, batch.tgt_out.to(self.device), self.recipe.label_smoothing, c.pad_id)
            loss_sum, nll_sum, tokens = loss_sum + loss.item(), nll_sum + nll.item(), tokens + batch.n_tgt_tokens
        record = {"step": self.step, "split": "dev", "loss": loss_sum / tokens, "ppl": perplexity(nll_sum / tokens)}
        count = min(self.recipe.eval_bleu_sentences, len(self.data.dev_text))
        if self.tokenizer is not None and count:
            decode = dataclasses.replace(DECODE_PRESETS["validate"], precision=self.recipe.precision)
            # zh, ja, ko references tokenized as sacreBLEU does for them (found in review: 13a, which splits no word of theirs)
            translator, pairs, hypotheses = Translator(self.model, self.tokenizer, decode), self.data.dev_text[:count], []
            for start in range(0, count, VALIDATION_CHUNK):  # a stop is heard between chunks
                if stop():
                    return None
                hypotheses += translator.translate([source for source, _ in pairs[start:start + VALIDATION_CHUNK]])
            result = score_hypotheses(hypotheses, [reference for _, reference in pairs], lang=self.data.tgt_lang, paper=False)
            record.update(bleu=result.bleu, chrf=result.chrf)
        return record

    # -- the loop --------------------------------------------------------------------------

    def fit(self) -> dict:
        """Train until `max_steps` or `minutes`; returns the last training record."""
        from tqdm.auto import tqdm

        recipe = self.recipe
        self.run.path.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            self.run.write_configs(self.config, recipe)
            if not self.data.dev:  # --eval-every would otherwise pass without a word
                self.echo("note: no dev pairs (no dev split, or none within --max-sentence-tokens): training runs without validation (dev loss, BLEU)")
        peak = matmul_peak_flops(self.device, recipe.precision)
        budget = recipe.minutes * 60 if recipe.minutes else math.inf
        self.model.train()
        bar = tqdm(total=recipe.max_steps, initial=self.step, desc="train", unit="step",
                   disable=self.rank != 0 or not sys.stderr.isatty(), dynamic_ncols=True)
        window = self.window
        last_save_time = time.monotonic()
        record: dict = {}
        with StopSignals() as signals:
            if self._validation_owed():  # left off by a stop at this step: an uninterrupted run logged it
                self._validate_and_log(signals)
            while self.step < recipe.max_steps and self.elapsed < budget and not self.stopping:
                record = self._step_and_report(signals, window, peak, budget, bar) or record
                due = recipe.save_minutes is not None and time.monotonic() - last_save_time >= recipe.save_minutes * 60
                if (recipe.save_every and self.step % recipe.save_every == 0) or due:
                    self._save()
                    last_save_time = time.monotonic()
            bar.close()
            if not self.run.checkpoints() or self.run.checkpoints()[-1] != self.run.checkpoint(self.step):
                self._save()
            if self.rank == 0:
                self.run.save_final(self.model, self.tokenizer, self.step)
                self.plot()
            if self.distributed:
                dist.barrier()
        self.stopping = self.stopping or signals.received  # one after the last step too (fault hunt: "done", exit 0)
        if self.stopping:
            hint = self.resume_hint
            if hint == RESUME_HINT and (self.step >= recipe.max_steps or self.elapsed >= budget):
                hint = f"its training is complete (model in {self.run.final})"
            self.echo(f"stopped by {signals.name or 'a signal to another process'} at step {self.step}; checkpoint saved "
                      f"in {self.run.checkpoint_root}; {hint}")  # (found in review: "stopped by None")
            raise KeyboardInterrupt if signals.name == "SIGINT" else Terminated
        return record

    def _step_and_report(self, signals: "StopSignals", window: dict, peak: float, budget: float, bar) -> Optional[dict]:
        """One optimiser step, then its progress bar, validation and log; returns the training
        record when one is logged. `window` sums the step's figures since the last record."""
        recipe = self.recipe
        record = None
        loss, nll, tokens, flops, seconds = self._train_step(signals)
        self.elapsed += seconds
        if self.train_step.compiles > self.compiles_told:  # why this step was slow
            self.compiles_told = self.train_step.compiles
            self.echo(f"torch.compile: {self.compiles_told} graph{'s' if self.compiles_told > 1 else ''} so far, "
                      f"{self.train_step.compile_seconds:.0f} s spent compiling")
        for key, value in zip(("loss", "nll", "tokens", "flops", "seconds"), (loss, nll, tokens, flops, seconds)):
            window[key] += value
        bar.update(1)
        last = self.step == recipe.max_steps or self.elapsed >= budget or self.stopping
        if self.step % recipe.log_every == 0 or last:
            record = {
                "step": self.step, "split": "train",
                "loss": window["loss"] / window["tokens"], "ppl": perplexity(window["nll"] / window["tokens"]),
                "lr": self.optimizer.param_groups[0]["lr"],
                "tokens_per_s": window["tokens"] / window["seconds"],
                "mfu": window["flops"] / window["seconds"] / (peak * self.world),
                "elapsed_s": round(self.elapsed, 1),
                "rss_mib": resident_mib(),  # the process's memory over a long run (docs/robustness.md)
            }
            if recipe.compile:
                record.update(compiles=self.train_step.compiles, compile_s=round(self.train_step.compile_seconds, 1))
            self._log(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", ppl=f"{record['ppl']:.1f}", lr=f"{record['lr']:.2e}",
                            tok_s=f"{record['tokens_per_s']:.0f}")
            if bar.disable:
                self.echo(f"step {self.step}: loss {record['loss']:.3f} ppl {record['ppl']:.1f} lr {record['lr']:.2e} "
                          f"{record['tokens_per_s']:.0f} tok/s MFU {record['mfu']:.1%}")
            if self.step % recipe.log_every == 0:  # a last record between boundaries: the window goes on in a resume
                for key in window:
                    window[key] = 0.0
        if self.data.dev and self.step % recipe.eval_every == 0 and not self.stopping:
            self._validate_and_log(signals)
        return record

    def _validate_and_log(self, signals: "StopSignals") -> None:
        """The validation of this step, logged, on rank 0; a signal during it leaves it off and
        stops every rank here, without another step (found in review: one more ran)."""
        dev = self.validate(lambda: signals.received) if self.rank == 0 else None
        if dev is not None:
            self._log(dev)
            self.echo("validation: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in dev.items()))
            self.plot()
        elif self.rank == 0:
            self.echo(f"validation of step {self.step} left off for the {signals.name}")
        self.stopping = sum_over_ranks(torch.tensor([float(signals.received)]), self.device).item() > 0

    def _validation_owed(self) -> bool:
        """Whether the step resumed from was due a validation its run never logged, left off or
        skipped for a stop (found by a fault hunt: never done). Rank 0 reads the log; all agree."""
        due = bool(self.data.dev) and self.step > 0 and self.step % self.recipe.eval_every == 0
        owed = due and self.rank == 0 and not any(
            r.get("split") == "dev" and r["step"] == self.step for r in self.run.read_log(echo=lambda _: None))
        return due and sum_over_ranks(torch.tensor([float(owed)]), self.device).item() > 0

    def plot(self) -> None:
        """RUN_DIR/loss.png: training and dev loss against the step."""
        if self.rank == 0:
            self.run.plot_losses()


def train_run(
    model_config: ModelConfig, recipe: TrainConfig, run_dir: Union[RunDir, str, Path], resume: bool = False,
    echo: Callable[[str], None] = print, resume_hint: str = RESUME_HINT,
) -> tuple[Trainer, Store]:
    """Everything `aiayn train` does: preprocess the corpus (or open --data), train. Returns
    the trainer (its model holds the last weights) and the data store."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    check_settings(model_config, recipe)
    rank, _ = init_distributed(recipe.device)
    echo = echo if rank == 0 else (lambda *_: None)
    # Rank 0 writes the run folder, and holds its lock until the run ends.
    with run.lock() if rank == 0 else contextlib.nullcontext():
        run.check_start(resume)
        tokenizer, data, store = prepare_data(model_config, recipe, run, echo)
        trainer = Trainer(model_config, recipe, run, data, tokenizer, resume=resume, echo=echo)
        trainer.resume_hint = resume_hint
        echo(f"model: {model_config.n_layers}+{model_config.n_layers} layers, d_model {model_config.d_model}, "
             f"{trainer.model.num_parameters():,} parameters, on {trainer.device} in {recipe.precision}{' with TF32 products' if recipe.tf32 else ''}")
        if (warning := memory_warning(model_config, recipe, trainer.device)) is not None:
            echo(warning)
        start, last = trainer.step, trainer.fit()
        echo(f"done at step {trainer.step} after {trainer.elapsed / 60:.1f} min"
             + (f": loss {last['loss']:.3f}, ppl {last['ppl']:.2f}" if last else "") + f"; model in {run.final}"
             + ("" if trainer.step > start else " (no step taken: --max-steps or --minutes, which counts every session's, was reached)"))
    return trainer, store
