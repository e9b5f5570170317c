"""Eole 0.6.4 (OpenNMT's successor) as a peer in aiayn's benchmarks.

Run with the interpreter of ``benchmarks/.venv-eole`` (made by benchmarks/setup_train_peers.sh).
Standalone: it imports only the standard library, torch and eole, never aiayn.
Three subcommands, each printing exactly one JSON line as the last line of stdout (Eole's own
logs go to stderr); a user error or an unsupported case exits non-zero with one line on stderr.

``speed``
    Training throughput of Transformer-base (or of Transformer-big with ``--model big``: d_model
    1024, 16 heads, d_ff 4096, dropout 0.3, Table 3) on synthetic batches: the fixed,
    padding-free batch (--rows pairs of --src-len + --tgt-len) or the real batch shapes of
    --shapes, on the CPU (``--device cpu``, the default) or on GPU 0 (``--device cuda``: Eole's
    builder with device_id 0 and gpu_ranks [0], the batches made on the GPU before the clock
    starts, the clock read after torch.cuda.synchronize, peak memory torch's
    max_memory_allocated; Eole's own CUDA setting of ``eole train`` applies: its
    ``configure_cuda_backends``, which leaves PyTorch's memory-efficient SDPA as the only
    attention kernel). ``--tf32`` (``--device cuda`` only) allows TF32 matrix products in fp32,
    which PyTorch leaves off. A step that Eole skips (it drops a batch on CUDA out of memory and
    logs a warning) is an error here, not a faster step. The model is
    built by Eole itself: a ``TrainConfig`` (Eole's pydantic config classes) is validated, the
    shared vocabulary is read by Eole's ``build_vocab``, the model by
    ``get_model_class(config.model).for_training`` (Eole's builder and weight init), the optimizer
    by ``Optimizer.from_config`` (Eole's wrapper: noam schedule, AMP scaler or none), and the loss
    and trainer by ``build_trainer`` (Eole's ``LossCompute`` with label smoothing inside its
    ``Trainer``). Every step goes through ``Trainer._accum_batches`` (Eole's token normalisation)
    and ``Trainer._train_step`` (zero_grad, forward under Eole's autocast choice, loss, backward,
    gradient sync no-op, ``Optimizer.step``). Not exercised: Eole's data pipeline (corpus reading,
    transforms, bucketing, padding/tensorify), ``Trainer.train``'s reporting, validation and
    checkpointing around the step. The batches are hand-made in the format of Eole's ``tensorify``:
    ``tgt`` is BOS + tokens + EOS, right-padded (the model feeds ``tgt[:, :-1]`` to the decoder and
    the loss scores ``tgt[:, 1:]``).

    Unsupported cases: none on this CPU; Eole trains in fp32 and in (pure) bf16; --tf32 with
    --device cpu is refused.

``train``
    Writes Eole's own YAML config and runs Eole's training CLI (``eole train -config``) as a child
    for a wall-clock budget, then reports the last complete checkpoint. All of Eole's training
    loop runs: its data pipeline, Trainer.train, reporting and checkpointing.

``translate``
    Decodes with Eole's own inference engine (``InferenceEnginePY``, the one behind
    ``eole predict``): beam search with GNMT length penalty.

Fairness notes (also in ``FAIRNESS_NOTES``, printed in every result):
"""

import json
import re
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    SPEED_MODELS, UserError, main, measure_speed, memory_mib, padded_ids, run_for, set_threads, speed_device,
    speed_shapes, thread_env,
)

FAIRNESS_NOTES = [
    (
        "pre-norm: Eole's decoder layer is pre-norm only (its encoder alone has a post-norm "
        "style), so both stacks use Eole's default pre-norm with a final layer norm"
    ),
    (
        "biases on the feed-forward projections are switched on (Eole's default has none), as "
        "§3.3's b_1 and b_2; the attention projections have none, as §3.2.2's and aiayn's (both "
        "systems had them before 2026-11-30); the tied output projection keeps Eole's generator "
        "bias (one parameter per vocabulary entry)"
    ),
    "weights are initialised by Eole with xavier_uniform (its default is uniform +-0.1)",
    "loss is normalised per target token (Eole's default normalises per sentence)",
    "no gradient clipping (max_grad_norm 0; Eole's default clips at 5)",
    (
        "sinusoidal positions are SinusoidalInterleaved (sin/cos on even/odd dims, as in the "
        "paper); embeddings are scaled by sqrt(d_model) by Eole"
    ),
    (
        "bf16 is Eole's 'pure' bf16 (compute_dtype bf16, use_amp false): weights, activations and "
        "Adam states in bf16, with torch-optimi's Adam (Kahan-summed updates) instead of "
        "torch.optim; compute_dtype bf16 with Eole's default use_amp true would be torch AMP "
        "(fp32 weights, bf16 autocast, GradScaler) instead"
    ),
    (
        "train: Eole reads the corpus with its own dynamic iterator (no transforms, no length "
        "filter, num_workers 0 so no loader processes compete for the CPU threads); dev.* is "
        "not used (no validation during training)"
    ),
    (
        "train: bucket_size 32,768 (Eole's default 262,144): the default fills its buffers by "
        "cycling a corpus the size of bible-en-es for over 90 s before the first step"
    ),
    (
        "train: a token batch is Eole's: sentences x the longest of (source, BOS + target + EOS) "
        "in the batch, padding included, up to max-tokens"
    ),
    (
        "train and translate: Eole's data pipeline gives the encoder the source without EOS "
        "(its encoder-decoder format); the speed batch ends every source with EOS as asked"
    ),
    (
        "train: stopped by SIGTERM once the time budget is spent; Eole saves nothing on a stop, "
        "so the last checkpoint it completed is used"
    ),
    (
        "translate: Eole's only relative length limit is ratio * padded batch source length + 5, "
        "so the ratio is switched off and max_length = longest source in the file + extra_len "
        "holds for every sentence"
    ),
]
__doc__ += "".join(f"\n- {note}" for note in FAIRNESS_NOTES) + "\n"

# The specials that head vocab.txt, in id order, and the ids they must keep.
SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def _config_dict(*, vocab_path, vocab_size, layers, d_model, heads, d_ff, dropout, label_smoothing,
                 precision, learning_rate, warmup_steps, seed):
    """Eole's config (the shape of its YAML) for the common Transformer shape.

    learning_rate with decay_method noam gives lr = learning_rate * d_model^-0.5 *
    min(step^-0.5, step * warmup^-1.5): Eole's noam_decay is exactly that factor, taken with
    model.hidden_size, and its Optimizer multiplies it by learning_rate, counting steps from 1.
    """
    return {
        "seed": seed,
        "src_vocab": str(vocab_path),
        "share_vocab": True,
        # the whole vocabulary, ids as in the file: no frequency cap, no padding of its size
        "src_vocab_size": vocab_size,
        "tgt_vocab_size": vocab_size,
        "vocab_size_multiple": 1,
        **SPECIALS,
        "model": {
            "architecture": "transformer",
            "layers": layers,
            "hidden_size": d_model,
            "heads": heads,
            "transformer_ff": d_ff,
            "mlp_activation_fn": "relu",
            "add_qkvbias": False,
            "add_final_linear_bias": False,
            "add_ffnbias": True,
            "share_embeddings": True,
            "share_decoder_embeddings": True,
            "embeddings": {
                "word_vec_size": d_model,
                "position_encoding_type": "SinusoidalInterleaved",
            },
        },
        "training": {
            "compute_dtype": precision,
            # use_amp false is Eole's "pure" bf16 (bf16 weights, torch-optimi's Adam). It is set
            # for bf16 only: with use_amp false Eole swaps in torch-optimi for fp32 too, where its
            # default (use_amp true, no effect on fp32 compute) keeps torch.optim.Adam.
            "use_amp": precision != "bf16",
            "param_init_method": "xavier_uniform",
            "optim": "adam",
            "adam_beta1": 0.9,
            "adam_beta2": 0.98,
            "adam_eps": 1e-9,
            "learning_rate": learning_rate,
            "decay_method": "noam",
            "warmup_steps": warmup_steps,
            "max_grad_norm": 0,
            "label_smoothing": label_smoothing,
            "dropout": [dropout],
            "attention_dropout": [0.0],
            "normalization": "tokens",
            "accum_count": [1],
            "world_size": 1,
            "gpu_ranks": [],
            "num_workers": 0,
        },
    }


# ---------------------------------------------------------------------------------------------
# speed


def cmd_speed(args):
    """Time one optimizer step of Transformer-base or -big through Eole's Trainer per batch shape."""
    set_threads(args.threads)
    device = speed_device(args)  # --tf32 takes effect here, before anything is built
    cuda = device == "cuda"
    device_id = 0 if cuda else -1  # Eole's device ids: -1 the CPU, 0 the first GPU
    start_mib = memory_mib(device)
    import torch
    from eole.config.run import TrainConfig
    from eole.inputters.inputter import build_vocab
    from eole.models.model import get_model_class
    from eole.trainer import build_trainer
    from eole.transforms import get_specials, get_transforms_cls
    from eole.utils import Statistics
    from eole.utils.misc import configure_cuda_backends, set_random_seed
    from eole.utils.optimizers import Optimizer

    if args.vocab <= 5:
        raise UserError("need --vocab > 5")
    shapes = speed_shapes(args)
    dims = SPEED_MODELS[args.model]  # layers, d_model, heads, d_ff, dropout
    with tempfile.TemporaryDirectory() as tmp:
        # Eole reads its vocabulary from a file; this one has the specials at ids 0..3.
        vocab_path = Path(tmp, "vocab.txt")
        pieces = list(SPECIALS.values()) + [f"w{i}" for i in range(len(SPECIALS), args.vocab)]
        vocab_path.write_text("".join(f"{p}\t1\n" for p in pieces))
        config_dict = _config_dict(
            vocab_path=vocab_path, vocab_size=args.vocab, **dims, label_smoothing=0.1,
            precision=args.precision,
            # the paper's schedule; the rate does not change the time of a step
            learning_rate=1.0, warmup_steps=4000, seed=args.seed,
        )
        if cuda:  # one process on one GPU, as `eole train` with gpu_ranks [0]
            config_dict["training"]["gpu_ranks"] = [0]
        config = TrainConfig(data={}, **config_dict)
        config._validate_data_config()  # as train_single does: derives the transform list
        if cuda:  # as train_single.main does on a GPU
            torch.cuda.set_device(device_id)
        set_random_seed(config.seed, cuda)
        specials = get_specials(config, get_transforms_cls(config._all_transform))
        vocabs = build_vocab(config, specials)
    if cuda:
        configure_cuda_backends()  # as train_single.main does before it builds the model
    model = get_model_class(config.model).for_training(
        config.model, vocabs, config.training, device_id=device_id
    )
    on = next(model.parameters()).device
    if on.type != device:
        raise UserError(f"eole built the model on {on}, not on {device}")
    optim = Optimizer.from_config(model, config)
    trainer = build_trainer(config, device_id, model, vocabs, optim, model_saver=None)

    ids = {name: vocabs["src"][token] for name, token in SPECIALS.items()}
    assert ids == {"pad_token": 0, "bos_token": 1, "eos_token": 2, "unk_token": 3}, ids
    gen = torch.Generator().manual_seed(args.seed)

    def make_batch(shape):
        """Eole's tensorify format: src ids + EOS, tgt BOS + ids + EOS, both padded."""
        rows = len(shape["src"])
        src = padded_ids(shape["src"], args.vocab, gen, ids["eos_token"], ids["pad_token"])
        tgt = padded_ids(shape["tgt"], args.vocab, gen, ids["eos_token"], ids["pad_token"])
        # on the model's device, as Eole's OnDeviceDatasetIter moves every tensor of a batch
        return {
            "src": src.to(on),
            "srclen": torch.tensor(shape["src"]).to(on),
            "tgt": torch.cat([torch.full((rows, 1), ids["bos_token"]), tgt], 1).to(on),
            "tgtlen": (torch.tensor(shape["tgt"]) + 1).to(on),
            "prefix_len": None,
            "images": None,
            "cid": ["speed"] * rows,
            "cid_line_number": list(range(rows)),
        }

    def step_on(batch):
        def one_step():
            before = optim.training_step
            # The iterator yields (batch, bucket_idx) like Eole's DynamicDatasetIter.
            for batches, normalization in trainer._accum_batches(iter([(batch, 0)])):
                trainer._train_step(
                    batches, normalization, Statistics(), Statistics(), step=optim.training_step
                )
            if optim.training_step != before + 1:  # Eole drops a batch that runs out of GPU memory
                raise UserError(f"eole skipped the optimizer step of a {tuple(batch['tgt'].shape)} target batch "
                                "(CUDA out of memory: see its warning above)")
        return one_step

    steps = [step_on(make_batch(shape)) for shape in shapes]
    tokens = sum(sum(shape["tgt"]) for shape in shapes)  # ids + EOS: what the loss scores

    weights = "/".join(sorted({str(p.dtype) for p in model.parameters()}))
    adam = type(optim._optimizer)
    where = f"{device} ({torch.cuda.get_device_name(on)})" if cuda else device
    tf32 = ", TF32 matmuls allowed" if args.tf32 else ""
    return measure_speed(args, steps, tokens, model, start_mib, (
        f"compute_dtype {args.precision}, use_amp {str(config.training.use_amp).lower()}: "
        f"weights {weights}, optimizer {adam.__module__}.{adam.__name__}, "
        f"autocast {'on' if optim.amp else 'off'}; device {where}{tf32}, model {args.model}"
    ))


# ---------------------------------------------------------------------------------------------
# train


def _last_checkpoint(model_dir):
    """(step, path) of the newest complete step_N checkpoint Eole wrote, or (None, None).

    Eole's saver writes config.json last, so a step_N with a readable config.json is complete;
    one cut short by the stop has none and is skipped.
    """
    steps = []
    for path in Path(model_dir).glob("step_*"):
        match = re.fullmatch(r"step_(\d+)", path.name)
        if match and (path / "model.00.safetensors").is_file():
            try:
                json.loads((path / "config.json").read_text())
            except (OSError, ValueError):
                continue
            steps.append((int(match.group(1)), path))
    return max(steps) if steps else (None, None)


def _write_eole_vocab(vocab_txt, dest):
    """Copy vocab.txt into Eole's vocab format (token<TAB>count) and return its size.

    The counts are equal, so Eole keeps the file's order and every piece keeps its id.
    """
    pieces = Path(vocab_txt).read_text(encoding="utf-8").splitlines()
    if pieces[: len(SPECIALS)] != list(SPECIALS.values()):
        raise UserError(f"{vocab_txt} must start with the specials {' '.join(SPECIALS.values())}")
    Path(dest).write_text("".join(f"{p}\t1\n" for p in pieces), encoding="utf-8")
    return len(pieces)


def cmd_train(args):
    """Run `eole train` on DIR for `minutes` of wall clock and report its last checkpoint."""
    data, out = Path(args.data).resolve(), Path(args.out).resolve()
    for name in ("train.src", "train.tgt", "vocab.txt"):
        if not (data / name).is_file():
            raise UserError(f"{data / name} not found")
    if args.d_model % args.heads:
        raise UserError("--d-model must be a multiple of --heads")
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "model"
    if model_dir.exists() and any(model_dir.iterdir()):
        raise UserError(f"{model_dir} is not empty; give a fresh --out")
    vocab_size = _write_eole_vocab(data / "vocab.txt", out / "vocab.eole")
    config = _config_dict(
        vocab_path=out / "vocab.eole", vocab_size=vocab_size, layers=args.layers,
        d_model=args.d_model, heads=args.heads, d_ff=args.d_ff, dropout=args.dropout,
        label_smoothing=args.label_smoothing, precision=args.precision,
        learning_rate=args.lr_scale, warmup_steps=args.warmup_steps, seed=args.seed,
    )
    if args.no_output_bias:  # an ablation (benchmarks/learning_curve.py): aiayn's tied output layer has no bias
        config["model"]["generator_bias"] = False
    config["data"] = {
        "corpus_1": {"path_src": str(data / "train.src"), "path_tgt": str(data / "train.tgt")}
    }
    config["training"].update({
        "model_path": str(model_dir),
        "batch_type": "tokens",
        "batch_size": args.max_tokens,
        "save_checkpoint_steps": args.save_every,
        "keep_checkpoint": args.keep_last,
        # one pass over a corpus the size of bible-en-es: Eole's default (262,144) fills its
        # buffers by cycling such a corpus for over 90 s before its first step
        "bucket_size": 32768,
        # stopped by the clock, or at --max-steps for a comparison at equal steps
        "train_steps": args.max_steps or 10_000_000,
        "valid_steps": 10_000_000,  # no valid corpus is given; this only quiets the step report
    })
    config["report_every"] = 10  # "Step N/..." lines: the step reached even after the last save
    config_path = out / "eole.yaml"
    # JSON is YAML: no yaml dependency is needed to write Eole's config file.
    config_path.write_text(json.dumps(config, indent=2) + "\n")

    # Eole's CLI, installed next to this interpreter. It has no thread option: torch sizes its
    # intra-op pool from OMP_NUM_THREADS, which the child inherits.
    eole_cli = Path(sys.executable).parent / "eole"
    log_path = out / "train.log"
    _, wall_s = run_for([str(eole_cli), "train", "-config", str(config_path)], args.minutes, log_path,
                        thread_env(args.threads))
    step, checkpoint = _last_checkpoint(model_dir)
    if checkpoint is None:
        log_lines = log_path.read_text(errors="replace").strip().splitlines() or ["(empty log)"]
        # the exception line says more than the traceback's last line (often a help URL)
        errors = [line for line in log_lines if re.match(r"\w[\w.]*(Error|Exception)\b", line)]
        raise UserError(f"eole saved no checkpoint in {wall_s:.0f} s; log {log_path}: {(errors or log_lines)[-1].strip()}")
    reached = [int(s) for s in re.findall(r"Step (\d+)/", log_path.read_text(errors="replace"))]
    # The step reached, counted as aiayn's and OpenNMT-py's are (found in review: the last
    # checkpoint's step, which undercounted Eole's steps by up to a save interval).
    return {
        "steps": max(reached, default=step),
        "checkpoint_step": step,
        "checkpoint": str(checkpoint),
        "wall_s": wall_s,
        "config": str(config_path),
        "log": str(log_path),
    }


# ---------------------------------------------------------------------------------------------
# translate


def cmd_translate(args):
    """Beam-search FILE with Eole's inference engine and write one line of pieces per input."""
    set_threads(args.threads)
    from eole.config.run import PredictConfig
    from eole.inference_engine import InferenceEnginePY
    from eole.utils.logging import init_logger
    from eole.utils.misc import set_random_seed

    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"{model} is not an Eole checkpoint directory (no config.json)")
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    if not lines:
        raise UserError(f"{args.src} is empty")
    init_logger()
    config = PredictConfig(
        model_path=str(model),
        src=str(args.src),
        output=str(args.out),
        world_size=1,
        gpu_ranks=[],
        compute_dtype=args.precision,
        beam_size=args.beam,
        length_penalty="wu",
        alpha=args.alpha,
        max_length_ratio=0,
        max_length=max(len(line.split()) for line in lines) + args.extra_len,
        batch_type="tokens",
        batch_size=args.batch_tokens,
        seed=1,
    )
    set_random_seed(config.seed, False)
    engine = InferenceEnginePY(config)  # loads the checkpoint: not part of the timing
    started = time.perf_counter()
    engine.infer_file()
    seconds = time.perf_counter() - started
    engine.terminate()
    written = len(Path(args.out).read_text(encoding="utf-8").splitlines())
    if written != len(lines):
        raise UserError(f"eole wrote {written} lines for {len(lines)} inputs")
    return {"seconds": seconds, "sentences": len(lines), "max_length": config.max_length}


# ---------------------------------------------------------------------------------------------


if __name__ == "__main__":
    main("eole_peer", __doc__.split("\n")[0], {"speed": cmd_speed, "train": cmd_train, "translate": cmd_translate},
         FAIRNESS_NOTES, speed_options=True)
