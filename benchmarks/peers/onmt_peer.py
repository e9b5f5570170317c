"""OpenNMT-py 3.0.4 as a peer of aiayn: training speed, a timed training run, and beam decoding.

Run it with the Python of `benchmarks/.venv-peers` (OpenNMT-py 3.0.4, torch 2.13.0+cpu); it
imports nothing of aiayn. Three subcommands, each printing one JSON line on stdout as its last
line (OpenNMT-py's own logs go to stderr or to a log file):

speed      Tokens per second of Transformer-base training steps on hand-made batches.
train      Trains a model with OpenNMT-py's own `onmt_train` for a given number of minutes.
translate  Decodes a file of SentencePiece pieces with OpenNMT-py's own `onmt_translate`.

How the model is built. Every option goes through OpenNMT-py's own parser (`onmt.opts.train_opts`,
then `ArgumentParser.update_model_opts` / `validate_model_opts`) for `speed`, and through its own
YAML config read by `onmt_train -config` for `train`; both use the same option set
(`model_opts` below): transformer encoder and decoder, hidden_size = word_vec_size = d_model, heads,
transformer_ff, ReLU, sinusoidal positions (SinusoidalInterleaved: sin on even, cos on odd
dimensions, as the paper), embeddings scaled by sqrt(d_model) (OpenNMT-py always does this), one
shared vocabulary with share_embeddings and share_decoder_embeddings (tied output projection),
dropout 0.1, attention_dropout 0.0, label smoothing 0.1, Adam(0.9, 0.98), no gradient clipping
(max_grad_norm 0), Glorot-uniform initialisation (param_init 0, param_init_glorot, OpenNMT-py's
recommended Transformer recipe), loss normalised by target tokens (normalization tokens).

`speed` builds the model with `onmt.model_builder.build_model`, the optimizer with
`onmt.utils.optimizers.Optimizer.from_opt`, and the trainer with `onmt.trainer.build_trainer`
(which makes its `onmt.utils.loss.LossCompute`). One step is `Trainer._accum_batches` (the
normalisation) then `Trainer._gradient_accumulation`, which zeroes the gradients, runs the
forward pass, the loss, the backward pass and `Optimizer.step()` (noam learning rate, Adam) —
the body of `Trainer.train`'s loop. Not exercised: its data pipeline (corpus reading, bucketing,
token batching, padding, DataLoader), the dropout schedule, report logging and checkpoint saving
of `Trainer.train`. A batch is in OpenNMT-py's batch format (a dict with `src` (rows, S, 1),
`srclen`, `tgt` (rows, T + 1, 1)): source = random ids + EOS, target = BOS + random ids + EOS,
right-padded with <blank>: the fixed batch (`rows` pairs of src_len + tgt_len, no padding) or
the real batch shapes of --shapes. OpenNMT-py feeds tgt[:, :-1] to the decoder and predicts
tgt[:, 1:], i.e. the ids and the EOS of each pair.

Fairness notes (how OpenNMT-py 3.0.4 differs from the common shape):
- Pre-norm: LayerNorm(eps 1e-6) before each sub-layer, plus a final LayerNorm on each stack
  (the paper is post-norm). OpenNMT-py 3.0.4 has no post-norm option.
- Its feed-forward block has a second dropout after the ReLU (dropout_1) besides the residual
  dropout; there is no option to switch it off alone.
- Attention projections have no biases (add_qkvbias off), as §3.2.2's and aiayn's (both had them
  before 2026-11-30); the output projection is a Linear with a bias: its weight is tied to the embeddings, its
  8,000-entry bias is an extra trained parameter that aiayn does not have.
- Loss: torch's CrossEntropyLoss(label_smoothing=0.1, reduction sum), smoothing over all V, on
  fp32 logits; OpenNMT-py divides it by the number of target tokens minus one per sentence (it
  does not count the EOS in `_accum_batches`), a constant scale of the loss.
- Adam's epsilon is hard-coded to 1e-8 in `build_torch_optimizer`; `speed` sets it to 1e-9 on
  the torch optimizer after building (no effect on the cost of a step), `train` cannot (no
  option) and trains with 1e-8.
- Learning rate: OpenNMT-py's noam is learning_rate · hidden_size^-0.5 · min(step^-0.5,
  step · warmup^-1.5), with step counted from 1, so learning_rate = lr_scale gives exactly
  lr_scale · d_model^-0.5 · min(...).
- `train` data: OpenNMT-py appends no EOS to the source (source = the pieces only) and wraps the
  target as BOS + pieces + EOS. Its token batches count sentences × the longest of (source
  length, target length + 2) in the batch; it reads a bucket of 32,768 examples (its default,
  262,144, cycles a corpus the size of bible-en-es 9 times before the first step), sorts and batches it, and drops a pair whose source repeats
  inside the same batch. Data are read in the training process (num_workers 0), so it uses only
  the given threads; the first step waits for the first bucket (15 s for a 400-line corpus on
  this machine), which counts in the minutes, as all of onmt_train's start-up does.
- `train` stop: OpenNMT-py saves nothing when interrupted, so the result is the last checkpoint
  saved before the stop (up to save-every steps behind `steps`, the last step logged).
- bf16: OpenNMT-py 3.0.4 cannot train or decode in bf16. model_dtype accepts fp32 or fp16 only,
  and fp16 goes through torch.cuda.amp (GradScaler, autocast) or apex, both for GPUs;
  `--precision bf16` exits 2 saying so.
- `translate`: OpenNMT-py's beam search with length_penalty wu (GNMT, alpha 0.6). Its length cap
  is one fixed -max_length for the whole file, not per sentence; it is set to the longest source
  (in pieces) + 50, so shorter sentences may run up to that cap. `seconds` is the wall clock of
  the whole `onmt_translate` process (Python start-up, imports and model loading included);
  `decode_s` is OpenNMT-py's own translation time (-report_time: average ms × sentences).
- OpenNMT-py 3.0.4 loads its checkpoints with a bare torch.load, which fails on torch >= 2.6
  (weights_only is the default there); `train` and `translate` set
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 in the environment of their child processes.
- Threads: `speed` calls torch.set_num_threads; `train` and `translate` set OMP_NUM_THREADS and
  MKL_NUM_THREADS (torch's intra-op thread count follows OMP_NUM_THREADS) for the child.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

from harness import UserError, main, measure_speed, padded_ids, run_for, speed_shapes, status_mib, thread_env

# torch and onmt are imported inside `speed` only: `train` and `translate` just start OpenNMT-py's
# own tools, and a parent that loaded torch would only add to the memory of the machine.
# OpenNMT-py 3.0.4 uses torch.cuda.amp.custom_fwd and friends, deprecated in torch 2.13.
warnings.simplefilter("ignore", FutureWarning)

# The docstring's fairness notes, one line each, for every result line.
FAIRNESS_NOTES = [" ".join(note.split()) for note in __doc__.split("common shape):\n- ")[1].split("\n- ")]

# OpenNMT-py's special tokens (onmt.constants.DefaultTokens) and their ids in its vocabularies.
ONMT_SPECIALS = ("<unk>", "<blank>", "<s>", "</s>")
# The specials that open the caller's vocab.txt, in that order.
CALLER_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
BF16_UNSUPPORTED = ("OpenNMT-py 3.0.4 has no bf16 support: model_dtype is fp32 or fp16, and fp16 "
                    "runs through torch.cuda.amp or apex (GPU only)")


def model_opts(layers: int, d_model: int, heads: int, d_ff: int, dropout: float,
               label_smoothing: float, learning_rate: float, warmup_steps: int,
               seed: int) -> dict:
    """OpenNMT-py options for the compared Transformer, as option name -> value.

    The same dict becomes command-line arguments for `speed` and YAML for `train`."""
    return {
        "encoder_type": "transformer",
        "decoder_type": "transformer",
        "enc_layers": layers,
        "dec_layers": layers,
        "hidden_size": d_model,
        "word_vec_size": d_model,
        "heads": heads,
        "transformer_ff": d_ff,
        "pos_ffn_activation_fn": "relu",
        "self_attn_type": "scaled-dot",
        "add_qkvbias": False,
        "position_encoding": True,
        "position_encoding_type": "SinusoidalInterleaved",
        "share_embeddings": True,
        "share_decoder_embeddings": True,
        "dropout": [dropout],
        "attention_dropout": [0.0],
        "param_init": 0.0,
        "param_init_glorot": True,
        "model_dtype": "fp32",
        "label_smoothing": label_smoothing,
        "normalization": "tokens",
        "optim": "adam",
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "max_grad_norm": 0.0,
        "decay_method": "noam",
        "learning_rate": learning_rate,
        "warmup_steps": warmup_steps,
        "accum_count": [1],
        "seed": seed,
    }


def as_cli_args(opts: dict) -> list[str]:
    """Turns an option dict into OpenNMT-py command-line arguments (True: a bare flag)."""
    args = []
    for name, value in opts.items():
        if value is True:
            args.append(f"-{name}")
        elif isinstance(value, list):
            args += [f"-{name}"] + [str(v) for v in value]
        else:
            args += [f"-{name}", str(value)]
    return args


def as_yaml(opts: dict) -> str:
    """Writes an option dict as YAML: JSON values are valid YAML flow values."""
    return "".join(f"{name}: {json.dumps(value)}\n" for name, value in opts.items())


def child_env(threads: int) -> dict:
    """Environment of an OpenNMT-py child process: thread counts, and torch.load's old default
    (OpenNMT-py 3.0.4 cannot load its own checkpoints with weights_only=True)."""
    return thread_env(threads, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONWARNINGS="ignore::FutureWarning")


def onmt_tool(name: str) -> str:
    """Path of an OpenNMT-py console script installed beside this Python."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise UserError(f"{path} not found: run this with the Python of the OpenNMT-py venv")
    return str(path)


# ---------------------------------------------------------------------------------------------
# speed


def cmd_speed(args: argparse.Namespace) -> dict:
    """Times `steps` training steps of Transformer-base after `warmup` untimed ones."""
    if args.precision == "bf16":
        raise UserError(BF16_UNSUPPORTED, code=2)
    if args.vocab <= len(ONMT_SPECIALS) + 1:
        raise UserError("--vocab must exceed 5")
    shapes = speed_shapes(args)
    import torch

    torch.set_num_threads(args.threads)
    from onmt.constants import DefaultTokens
    from onmt.inputters.inputter import dict_to_vocabs
    from onmt.model_builder import build_model
    from onmt.opts import train_opts
    from onmt.trainer import build_trainer
    from onmt.utils.optimizers import Optimizer
    from onmt.utils.parse import ArgumentParser
    from onmt.utils.statistics import Statistics

    start_mib = status_mib("VmRSS")
    parser = ArgumentParser()
    train_opts(parser)
    # -data and -src_vocab are required by the parser but unused: the vocabulary and the batch
    # are made here, without OpenNMT-py's data pipeline. The paper's noam schedule (learning_rate
    # 1, warmup 4000); the rate does not change the cost of a step.
    opt = parser.parse_args(
        ["-data", "{}", "-src_vocab", "unused"]
        + as_cli_args(model_opts(layers=6, d_model=512, heads=8, d_ff=2048, dropout=0.1,
                                 label_smoothing=0.1, learning_rate=1.0, warmup_steps=4000,
                                 seed=args.seed)))
    opt.data = {}  # build_trainer looks for validation transforms in it
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    torch.manual_seed(args.seed)  # the initial weights

    # One shared vocabulary: OpenNMT-py's four specials, then made-up pieces up to `vocab`.
    tokens = list(ONMT_SPECIALS) + [f"piece{i}" for i in range(args.vocab - len(ONMT_SPECIALS))]
    vocabs = dict_to_vocabs({"src": tokens, "tgt": tokens, "data_task": "seq2seq"})
    model = build_model(opt, opt, vocabs, checkpoint=None)
    optim = Optimizer.from_opt(model, opt)
    for group in optim._optimizer.param_groups:
        group["eps"] = 1e-9  # build_torch_optimizer hard-codes 1e-8; the common shape is 1e-9
    trainer = build_trainer(opt, -1, model, vocabs, optim)

    gen = torch.Generator().manual_seed(args.seed)
    specials = {name: vocabs["tgt"][token] for name, token in
                (("bos", DefaultTokens.BOS), ("eos", DefaultTokens.EOS), ("pad", DefaultTokens.PAD))}
    total_stats, report_stats = Statistics(), Statistics()  # _gradient_accumulation fills them

    def step_on(shape: dict):
        batch = make_batch(shape, args.vocab, gen, **specials)
        batches, normalization = next(trainer._accum_batches(iter([batch])))

        def step() -> None:
            trainer._gradient_accumulation(batches, normalization, total_stats, report_stats)
        return step

    steps = [step_on(shape) for shape in shapes]
    tokens = sum(sum(shape["tgt"]) for shape in shapes)  # ids + EOS: what the loss scores
    return measure_speed(args, steps, tokens, model, start_mib, "fp32 (OpenNMT-py model_dtype fp32, no autocast)")


def make_batch(shape: dict, vocab: int, generator, bos: int, eos: int, pad: int) -> dict:
    """One batch shape in OpenNMT-py's batch format, with random content ids from [4, vocab - 1),
    clear of the four specials (ids 0-3)."""
    import torch

    rows = len(shape["src"])
    src = padded_ids(shape["src"], vocab, generator, eos, pad)
    tgt = torch.cat([torch.full((rows, 1), bos), padded_ids(shape["tgt"], vocab, generator, eos, pad)], dim=1)
    return {
        "src": src.unsqueeze(-1),  # (rows, S, 1): OpenNMT-py keeps a features axis
        "srclen": torch.tensor(shape["src"]),
        "tgt": tgt.unsqueeze(-1),  # (rows, T + 1, 1): decoder in [:-1], targets [1:]
    }


# ---------------------------------------------------------------------------------------------
# train


def write_vocab(data: Path, out: Path) -> tuple[Path, int]:
    """Writes vocab.txt in OpenNMT-py's vocab format (one token a line, specials left out: it
    adds its own <unk>, <blank>, <s>, </s> first). Returns the path and the vocabulary size."""
    source = data / "vocab.txt"
    if not source.is_file():
        raise UserError(f"{source} not found")
    pieces = source.read_text(encoding="utf-8").splitlines()
    if tuple(pieces[:len(CALLER_SPECIALS)]) != CALLER_SPECIALS:
        raise UserError(f"{source} must start with the specials {' '.join(CALLER_SPECIALS)}")
    target = out / "vocab.onmt"
    target.write_text("".join(p + "\n" for p in pieces[len(CALLER_SPECIALS):]), encoding="utf-8")
    return target, len(pieces)


def train_config(args: argparse.Namespace, vocab: Path, vocab_size: int) -> dict:
    """The full `onmt_train` configuration (see the module docstring for the choices)."""
    data = args.data.resolve()
    config = {
        # Pieces are already tokenized: no transforms (also its default). No `valid` corpus: no
        # validation.
        "data": {"corpus_1": {"path_src": str(data / "train.src"),
                              "path_tgt": str(data / "train.tgt"), "transforms": []}},
        "src_vocab": str(vocab),
        "share_vocab": True,
        "src_vocab_size": vocab_size,
        "tgt_vocab_size": vocab_size,
        "vocab_size_multiple": 1,  # its default 8 would pad the vocabulary
        "save_model": str(args.out.resolve() / "model"),
        "save_checkpoint_steps": args.save_every,
        "keep_checkpoint": args.keep_last,
        # stopped by the clock, or at --max-steps for a comparison at equal steps
        "train_steps": args.max_steps or 10_000_000,
        "valid_steps": 10_000_000,
        "batch_type": "tokens",
        "batch_size": args.max_tokens,
        "num_workers": 0,
        "bucket_size": 32768,  # one pass over bible-en-es; the default cycles it 9 times first
        "world_size": 1,
        "report_every": 1,  # a log line per step: the last step reached is read from it
    }
    config.update(model_opts(layers=args.layers, d_model=args.d_model, heads=args.heads,
                             d_ff=args.d_ff, dropout=args.dropout,
                             label_smoothing=args.label_smoothing,
                             learning_rate=args.lr_scale, warmup_steps=args.warmup_steps,
                             seed=args.seed))
    return config


def cmd_train(args: argparse.Namespace) -> dict:
    """Runs `onmt_train` for `minutes` of wall clock, then stops it."""
    if args.precision == "bf16":
        raise UserError(BF16_UNSUPPORTED, code=2)
    if args.no_output_bias:
        raise UserError("--no-output-bias is an ablation of Eole's harness only", code=2)
    for name in ("train.src", "train.tgt"):
        if not (args.data / name).is_file():
            raise UserError(f"{args.data / name} not found")
    args.out.mkdir(parents=True, exist_ok=True)
    vocab, vocab_size = write_vocab(args.data, args.out)
    config_path = args.out / "onmt_train.yaml"
    config_path.write_text(as_yaml(train_config(args, vocab, vocab_size)), encoding="utf-8")
    log_path = args.out / "train.log"

    finished, wall_s = run_for([onmt_tool("onmt_train"), "-config", str(config_path)], args.minutes, log_path,
                               child_env(args.threads))

    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    if finished:
        tail = log_text.strip().splitlines()[-1:] or ["(empty log)"]
        raise UserError(f"onmt_train exited early: {tail[0]} (log: {log_path})")
    last_step = max((int(s) for s in re.findall(r"Step (\d+)/", log_text)), default=0)
    checkpoint = last_complete_checkpoint(args.out, last_step)
    if checkpoint is None:
        raise UserError(f"no complete checkpoint within {args.minutes} minutes "
                        f"(last step {last_step}, log: {log_path})")
    return {"steps": last_step, "checkpoint": str(checkpoint), "wall_s": wall_s,
            "config": str(config_path)}


def last_complete_checkpoint(out: Path, last_step: int) -> Path | None:
    """The newest checkpoint known to be fully written.

    OpenNMT-py logs step N, then saves model_step_N.pt (a plain torch.save, not atomic), then
    trains step N + 1; a checkpoint is complete once a later step was logged, so one the stop may
    have cut short is skipped."""
    steps = [int(m.group(1)) for p in out.glob("model_step_*.pt")
             if (m := re.fullmatch(r"model_step_(\d+)\.pt", p.name))]
    complete = [s for s in steps if s < last_step]
    return out / f"model_step_{max(complete)}.pt" if complete else None


# ---------------------------------------------------------------------------------------------
# translate


def cmd_translate(args: argparse.Namespace) -> dict:
    """Decodes `src` with `onmt_translate` (beam search, GNMT length penalty)."""
    if args.precision == "bf16":
        raise UserError(BF16_UNSUPPORTED, code=2)
    for path in (args.model, args.src):
        if not path.is_file():
            raise UserError(f"{path} not found")
    lines = args.src.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise UserError(f"{args.src} is empty")
    # One -max_length for the whole file: the longest source (no EOS: OpenNMT-py adds none) + 50.
    max_length = max(len(line.split()) for line in lines) + args.extra_len
    command = [onmt_tool("onmt_translate"), "-model", str(args.model), "-src", str(args.src),
               "-output", str(args.out), "-gpu", "-1", "-beam_size", str(args.beam),
               "-length_penalty", "wu", "-alpha", str(args.alpha),
               "-max_length", str(max_length), "-batch_type", "tokens",
               "-batch_size", str(args.batch_tokens), "-report_time"]
    begin = time.monotonic()
    result = subprocess.run(command, check=False, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env(args.threads))
    seconds = time.monotonic() - begin
    sys.stderr.write(result.stdout)
    if result.returncode != 0:
        tail = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"onmt_translate failed with code {result.returncode}: {tail[0]}")
    written = len(args.out.read_text(encoding="utf-8").splitlines())
    if written != len(lines):
        raise UserError(f"onmt_translate wrote {written} lines for {len(lines)} inputs")
    # Its "Total translation time (s)" is rounded to 0.1 s; the per-sentence average in ms is finer.
    average_ms = re.search(r"Average translation time \(ms\): ([\d.]+)", result.stdout)
    decode_s = float(average_ms.group(1)) * len(lines) / 1000 if average_ms else None
    return {"seconds": seconds, "sentences": len(lines), "decode_s": decode_s,
            "max_length": max_length}


# ---------------------------------------------------------------------------------------------


if __name__ == "__main__":
    main("onmt_peer", __doc__.splitlines()[0], {"speed": cmd_speed, "train": cmd_train, "translate": cmd_translate},
         FAIRNESS_NOTES)
