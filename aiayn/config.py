"""Model configuration and the paper's presets (Table 3 of Vaswani et al., 2017).

`ModelConfig` names every hyper-parameter as the paper does (§3, §5.4, Table 3). It is a frozen
dataclass so that `dataclasses.replace(PRESETS["base"], vocab_size=8000)` gives a new, validated
config; the same object is written as JSON beside every saved model. `TrainConfig` is the recipe
of §5, `DecodeConfig` the decoding of §6.1 and §6.3 (`DECODE_PRESETS`). The `...Options` classes
are the commands' own settings, from which aiayn.cli makes every flag.

Length: this is the one home of the package's defaults (a test holds it so), so it holds every
configuration class and preset; split, the defaults would again live in several places.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

ACTIVATIONS = ("relu", "gelu", "swish")
POSITIONALS = ("sinusoidal", "learned", "sinusoidal_concat")


def _option(default=dataclasses.MISSING, help: str = "", **metadata):
    """A dataclass field with the help text its command-line flag shows."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True)
class ModelConfig:
    """Shape and options of a Transformer.

    `d_k` and `d_v` default to `d_model // n_heads` (§3.2.2) but are free parameters, as in rows A
    and B of Table 3. `None` keeps that default through `dataclasses.replace`, so changing
    `d_model` or `n_heads` of a preset changes the head sizes with it.
    """

    vocab_size: int = _option(37000, "shared source/target BPE vocabulary (§5.1)")
    d_model: int = _option(512, "d_model, the width of every layer (§3)")
    n_heads: int = _option(8, "h, attention heads (§3.2.2)")
    d_k: Optional[int] = _option(None, "d_k per head (default d_model / h; Table 3 rows A, B)")
    d_v: Optional[int] = _option(None, "d_v per head (default d_model / h; Table 3 row A)")
    d_ff: int = _option(2048, "inner width of the feed-forward networks (§3.3)")
    n_layers: int = _option(6, "N, layers of the encoder and of the decoder (§3.1)")
    dropout: float = _option(0.1, "P_drop: residual and embedding dropout (§5.4)")
    attention_bias: bool = _option(False, "biases on W^Q, W^K, W^V, W^O (§3.2.2's projections are matrices only; "
                                   "imported Marian models have them)")
    attention_dropout: float = _option(0.0, "dropout on attention weights (§5.4 names residual dropout only, so none by default; §6.3 tuned both for parsing)")
    activation: Literal["relu", "gelu", "swish"] = _option("relu", "the feed-forward non-linearity (§3.3: ReLU)")
    norm_first: bool = _option(False, "true: pre-norm x + Sublayer(LayerNorm(x)); false: §3.1's post-norm")
    layer_norm_eps: float = _option(1e-6, "LayerNorm's ε")
    positional: Literal["sinusoidal", "learned", "sinusoidal_concat"] = _option(
        "sinusoidal", "§3.5's sinusoids; learned (Table 3 row E); sinusoidal_concat: sin | cos halves (Marian)")
    max_len: int = _option(1024, "the longest position the positional table holds")
    neighborhood: Optional[int] = _option(None, "restricted self-attention (§4): attend within r // 2 positions")
    share_embeddings: bool = _option(True, "one embedding matrix for source and target (§3.4)")
    scale_embedding: bool = _option(True, "multiply the embeddings by √d_model (§3.4)")
    tie_output: bool = _option(True, "the pre-softmax projection is the target embedding (§3.4)")
    final_logits_bias: bool = _option(False, "a fixed bias added to the logits (imported Marian models)")
    pad_id: int = _option(0, "id of the padding token")
    bos_id: int = _option(1, "id of the beginning-of-sentence token")
    eos_id: int = _option(2, "id of the end-of-sentence token")
    unk_id: int = _option(3, "id of the unknown-piece token")

    def __post_init__(self) -> None:
        def fail(message: str) -> None:
            raise ValueError(f"invalid ModelConfig: {message}")

        _check_types(self)

        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                fail(f"{name} must be a positive integer, got {value!r}")
        for name in ("d_k", "d_v", "neighborhood"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                fail(f"{name} must be a positive integer or None, got {value!r}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            fail(f"d_model (--d-model) {self.d_model} is not divisible by n_heads (--n-heads) {self.n_heads}; "
                 "set d_k and d_v (--d-k, --d-v) explicitly")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                fail(f"{name} must be in [0, 1), got {value!r}")
        if not 0 < self.layer_norm_eps < math.inf:  # inf passed: every LayerNorm then output its bias (found in review)
            fail(f"layer_norm_eps must be positive and finite, got {self.layer_norm_eps!r}")
        if self.activation not in ACTIVATIONS:
            fail(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.positional not in POSITIONALS:
            fail(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.positional != "learned" and self.d_model % 2:
            fail(f"sinusoidal positions need an even d_model, got {self.d_model}")
        special = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id, "unk_id": self.unk_id}
        for name, value in special.items():
            if not 0 <= value < self.vocab_size:
                fail(f"{name}={value} is outside the vocabulary of {self.vocab_size}")
        # Marian starts decoding from its pad token, so only BOS may share an id (with pad).
        distinct = [self.pad_id, self.eos_id, self.unk_id]
        if len(set(distinct)) != 3 or self.bos_id in (self.eos_id, self.unk_id):
            fail(f"special token ids must differ (BOS may equal pad), got {special}")

    @property
    def head_dims(self) -> tuple[int, int]:
        """(d_k, d_v) with the paper's default d_model / h filled in."""
        default = self.d_model // self.n_heads
        return (self.d_k or default, self.d_v or default)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """A saved config; one saved before `attention_bias` existed had the biases (found by a
        faithfulness audit: they were always on, where the paper has none)."""
        return _from_dict(cls, {"attention_bias": True, **values} if isinstance(values, dict) else values)


SEED_LIMIT = 1 << 64  # a seed is below this: torch's generators take 64 bits


def _flag(name: str) -> str:
    """A field named as the API and the command line both call it: "max_tokens (--max-tokens)"."""
    return f"{name} (--{name.replace('_', '-')})"


@dataclass(frozen=True)
class TrainConfig:
    """The training recipe of §5. Defaults are the paper's base model's (`--preset big` sets its
    300K steps and 20 checkpoints kept, D3 and D4 their ε_ls: TRAIN_OVERRIDES), but for
    checkpoints: every `save_every` steps, where the paper wrote one every 10 minutes
    (`--save-every 0 --save-minutes 10`: by time alone). A 2-core CPU wants smaller batches (`max_tokens`) and a shorter
    warm-up, which the demo sets. A resumed run keeps its own, but for what its command line sets."""

    corpus: str = _option("bible-en-es",
                          "a built-in corpus name or a path (see `aiayn corpus`; aiayn.corpora.load_corpus)")
    data: Optional[str] = _option(None, "instead of --corpus: a DATA_DIR made by `aiayn preprocess`")
    src_lang: Optional[str] = _option(None, "the source language: a folder's file suffix, a TSV's first column")
    tgt_lang: Optional[str] = _option(None, "the target language: a folder's file suffix, a TSV's second column")
    max_tokens: int = _option(25000, "padded tokens per batch and process, source and target each (§5.1: about "
                                     "25,000 + 25,000 a step, so 3,125 under torchrun with 8 processes; "
                                     "base with a vocabulary of 8,000 then peaked at 18.5 GiB in fp32, 14.9 in bf16, on an AMD EPYC, "
                                     "and aiayn.flops puts its 37,000 at about 25 GiB in fp32: --accumulate N "
                                     "with 1/N of it makes the same batch in less memory)")
    accumulate: int = _option(1, "batches per optimiser step: the paper's batch on fewer devices")
    warmup_steps: int = _option(4000, "steps of linear learning-rate warm-up (§5.3)")
    lr_scale: float = _option(1.0, "multiplies the learning rate of §5.3")
    adam_eps: float = _option(1e-9, "Adam's ε (§5.3; fairseq's and Eole's default is 1e-8)")
    label_smoothing: float = _option(0.1, "ε_ls of §5.4")
    max_steps: int = _option(100_000, "stop after this many steps (§5.2: 100K for base)")
    minutes: Optional[float] = _option(None, "also stop after this many minutes of training in all (a resumed run's "
                                                 "earlier sessions count), whichever comes first")
    save_every: int = _option(1000, "steps between checkpoints (0: by --save-minutes alone, as §6.1's 10-minute ones)")
    save_minutes: Optional[float] = _option(None, "also checkpoint after this many minutes")
    keep_last: int = _option(5, "checkpoints kept (§6.1 averages the last 5 for base, 20 for big)")
    log_every: int = _option(100, "steps between training log records")
    eval_every: int = _option(1000, "steps between validations (dev loss, BLEU and chrF)")
    eval_bleu_sentences: int = _option(200, "dev sentences translated for the BLEU and chrF of each validation")
    max_sentence_tokens: int = _option(256, "longer pairs (in tokens, either side) are left out, and counted")
    seed: int = _option(1, "seed of the weights, the batch order and dropout")
    precision: Literal["fp32", "bf16", "fp16"] = _option(
        "fp32", "bf16: autocast, or a bf16 copy of the model with --bf16-weights (CPUs with AVX512-BF16 or "
                "AMX, GPUs); fp16: GPUs")
    tf32: bool = _option(False, "with fp32 on a CUDA GPU, true: matrix products in TF32 (Ampere and newer: "
                                "several times IEEE fp32's rate)")
    compile: bool = _option(False, "true: torch.compile the model (one graph for all batch shapes; the first steps "
                                   "compile, for a minute or more)")
    # bf16 only: the step runs on a copy of the model with bf16 weights and no autocast; the fp32
    # model stays the master that Adam updates and checkpoints hold (aiayn.train_kernels.Bf16Twin)
    bf16_weights: bool = _option(False, "with bf16, true: train a bf16 copy of the model, fp32 master weights for Adam "
                                        "(the fast recipe's default in bf16)")
    device: str = _option("auto", "auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    init_from: Optional[str] = _option(None, "fine-tune: start from this model or run folder's weights and tokenizer")

    def __post_init__(self) -> None:
        _check_types(self)
        positive = ("max_tokens", "accumulate", "warmup_steps", "max_steps", "save_every", "keep_last",
                    "log_every", "eval_every", "max_sentence_tokens")
        for name in positive:
            value = getattr(self, name)
            least = 0 if name == "save_every" and self.save_minutes is not None else 1  # save_every 0: by time alone
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"invalid TrainConfig: {_flag(name)} must be a positive integer, got {value!r}" +
                                 (" (0 only with --save-minutes: checkpoints by time alone)" if name == "save_every" and value == 0 else ""))
        if not 0 <= self.seed < SEED_LIMIT:  # torch's generators take 64 bits (found in review: an overflow's message)
            raise ValueError(f"invalid TrainConfig: {_flag('seed')} must be in [0, 2^64), got {self.seed}")
        if self.eval_bleu_sentences < 0:
            raise ValueError(f"invalid TrainConfig: {_flag('eval_bleu_sentences')} must be 0 or more, got {self.eval_bleu_sentences!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"invalid TrainConfig: {_flag('label_smoothing')} must be in [0, 1), got {self.label_smoothing}")
        for name in ("minutes", "save_minutes", "lr_scale", "adam_eps"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"invalid TrainConfig: {_flag(name)} must be positive and finite, got {value}")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"invalid TrainConfig: precision must be fp32, bf16 or fp16, got {self.precision!r}")
        if self.bf16_weights and self.precision != "bf16":
            raise ValueError(f"invalid TrainConfig: bf16_weights needs precision bf16, got {self.precision!r}")
        if self.tf32 and self.precision != "fp32":
            raise ValueError(f"invalid TrainConfig: tf32 needs precision fp32, got {self.precision!r}")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        return _from_dict(cls, values)


PRECISIONS = ("fp32", "bf16", "fp16")  # training and decoding
DECODE_PRECISIONS = (*PRECISIONS, "int8")  # int8 weights: decoding on a CPU only (aiayn.kernels)


# α past this gains nothing and overflows: ((5 + |Y|)/6)^α passes fp32's range near α = 17 for
# outputs of 1,000 tokens, and every hypothesis then scores -0 (found in review: --alpha 100).
MAX_ALPHA = 10.0


@dataclass(frozen=True)
class DecodeConfig:
    """How a trained model decodes. The defaults are §6.1's for translation ("beam search with a
    beam size of 4 and length penalty α = 0.6 ... maximum output length to input length + 50");
    `DECODE_PRESETS["parse"]` holds §6.3's. `aiayn.translate.translate_ids` takes one, and the
    decoding flags of `aiayn translate`, `parse`, `demo` and `serve` are made from these fields
    (their `help` and `least` metadata), so the two cannot drift apart."""

    beam: int = field(default=4, metadata={"least": 1, "help": "beam size; 1 is greedy"})
    alpha: float = field(default=0.6, metadata={"least": 0, "most": MAX_ALPHA,
                                                "help": "length penalty α of lp(Y) = ((5 + |Y|) / 6)^α"})
    extra_len: int = field(default=50, metadata={"least": 0, "help": "output tokens at most: source tokens + this"})
    # 1, as fairseq's default (§6.1 says nothing): a weak model's EOS at once outscores, with α's
    # length penalty, the whole translation of a one-word source (found in review: "God" -> "").
    min_len: int = field(default=1, metadata={"least": 0, "help": "output tokens at least (EOS barred before); "
                                                                  "1: no empty translation of a non-empty source"})
    max_output_len: Optional[int] = field(default=None, metadata={"least": 1, "help": "output tokens at most, whatever the source"})
    # Guards against outputs that loop, as fairseq, HF and CTranslate2 offer; off is §6.1's search.
    no_repeat_ngram_size: int = field(default=0, metadata={
        "least": 0, "help": "no n-gram of this many tokens twice in an output (fairseq's); 0: off"})
    repetition_penalty: float = field(default=1.0, metadata={
        "least": 1, "help": "log-probabilities of tokens already output × this (CTRL's, as HF's); 1: off"})
    # §6.1's "terminate early when possible", read two ways (README, "When beam search stops").
    stop: Literal["beams", "bound"] = field(default="beams", metadata={
        "help": "when a sentence's beam search ends: beams, once k hypotheses have ended (fairseq's); bound, "
                "once no live beam can outscore the best ended one (tensor2tensor's)"})
    batch_tokens: int = field(default=4000, metadata={"least": 1, "help": "source tokens × beam decoded together"})
    precision: Literal["fp32", "bf16", "fp16", "int8"] = field(
        default="fp32", metadata={"help": "fp32, bf16 on a CPU: weights laid out once for oneDNN; bf16, fp16 on a "
                                          "GPU: weights cast once; int8: int8 weights, CPU only"})
    cuda_graphs: bool = field(default=False, metadata={
        "help": "on a GPU, each decoding step of a batch one CUDA graph (aiayn.graphs; not the server's)"})

    def __post_init__(self) -> None:
        _check_types(self)
        for f in dataclasses.fields(self):
            problem = decode_field_problem(f.name, getattr(self, f.name))
            if problem:
                raise ValueError(f"invalid DecodeConfig: {f.name} {problem}")
        if self.max_output_len is not None and self.min_len > self.max_output_len:  # (found in review: max won, unsaid)
            raise ValueError(f"min_len (--min-len) {self.min_len} is more than max_output_len (--max-output-len) "
                             f"{self.max_output_len}")


def decode_field_problem(name: str, value) -> Optional[str]:
    """What is wrong with `value` for DecodeConfig field `name` ("must be at least 1, got 0"),
    or None; the CLI names the flag, the dataclass the field."""
    meta = next(f for f in dataclasses.fields(DecodeConfig) if f.name == name).metadata
    least, most = meta.get("least"), meta.get("most")
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if least is not None and value is not None and not value >= least:
        return f"must be at least {least}, got {value}"
    if most is not None and value is not None and not value <= most:
        return f"must be at most {most:g}, got {value}"
    return None


def _fits(value, hint) -> bool:
    """Whether a JSON value has the type a config field declares (an int is a valid float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value in args
    if origin is typing.Union:
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


# Once per class: resolving the annotations costs 0.4 ms, and a server makes a DecodeConfig for
# every sentence that joins the running search.
_type_hints = functools.cache(typing.get_type_hints)


def _check_types(config) -> None:
    """One-line errors for values of the wrong type, as a config.json edited by hand can hold
    (`"dropout": "0.1"`), before any check compares them."""
    hints = _type_hints(type(config))
    for f in dataclasses.fields(config):
        value = given = getattr(config, f.name)
        # A Path where text goes, numpy's numbers where Python's go: taken as what they are (found
        # in review: TrainConfig(corpus=Path(...)) and ModelConfig(vocab_size=np.int64(8000)) refused)
        taken = os.fspath(value) if isinstance(value, os.PathLike) and _fits("", hints[f.name]) else \
            int(value) if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)) else \
            float(value) if isinstance(value, numbers.Real) and not isinstance(value, (int, float, bool)) else value
        if taken is not value:
            object.__setattr__(config, f.name, value := taken)
        if not _fits(value, hints[f.name]):
            raise ValueError(f"invalid {type(config).__name__}: {f.name} must be {_describe(hints[f.name])}, got {given!r}")


def _from_dict(cls, values):
    """`cls(**values)` for a dict read from a file, with a one-line error for unknown fields."""
    name = cls.__name__
    if not isinstance(values, dict):
        raise ValueError(f"a {name} must be a JSON object, got {type(values).__name__}")
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {name} field(s): {', '.join(map(repr, unknown))}")
    return cls(**values)


def _describe(hint) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}.get(
        hint, hint.__name__)


def _variation(**changes) -> ModelConfig:
    """A row of Table 3: the base model with the listed cells changed."""
    return dataclasses.replace(BASE, **changes)


BASE = ModelConfig()

# name -> (config, the paper's parameter count in millions where Table 3 prints one).
# Rows A and D change nothing that holds parameters; Table 3 leaves their cells empty (the base
# model's 65M applies), and row E's too, though its learned positions add a max_len × d_model
# table to the encoder and one to the decoder (1.05M at 1,024 × 512: `aiayn info --preset E`;
# found in review).
_TABLE3: dict[str, tuple[ModelConfig, Optional[float]]] = {
    "base": (BASE, 65),
    "big": (_variation(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3), 213),
    # (A) number of heads at constant computation
    "A1": (_variation(n_heads=1, d_k=512, d_v=512), None),
    "A2": (_variation(n_heads=4, d_k=128, d_v=128), None),
    "A3": (_variation(n_heads=16, d_k=32, d_v=32), None),
    "A4": (_variation(n_heads=32, d_k=16, d_v=16), None),
    # (B) smaller attention keys
    "B1": (_variation(d_k=16, d_v=64), 58),
    "B2": (_variation(d_k=32, d_v=64), 60),
    # (C) model size
    "C1": (_variation(n_layers=2), 36),
    "C2": (_variation(n_layers=4), 50),
    "C3": (_variation(n_layers=8), 80),
    "C4": (_variation(d_model=256, d_k=32, d_v=32), 28),
    "C5": (_variation(d_model=1024, d_k=128, d_v=128), 168),
    "C6": (_variation(d_ff=1024), 53),
    "C7": (_variation(d_ff=4096), 90),
    # (D) regularisation; label smoothing lives in the training config
    "D1": (_variation(dropout=0.0), None),
    "D2": (_variation(dropout=0.2), None),
    "D3": (BASE, None),  # ε_ls = 0.0, see TRAIN_OVERRIDES
    "D4": (BASE, None),  # ε_ls = 0.2
    # (E) learned positional embedding instead of sinusoids
    "E": (_variation(positional="learned"), None),
}

# Table 3 rows whose training differs from the base model's: big trains 300K steps (Table 3's
# "train steps"), and §6.1 averages its last 20 checkpoints, so it keeps 20; D3 and D4 change ε_ls.
TRAIN_OVERRIDES: dict[str, dict] = {"big": {"max_steps": 300_000, "keep_last": 20},
                                    "D3": {"label_smoothing": 0.0}, "D4": {"label_smoothing": 0.2}}

PAPER_PARAMS_M: dict[str, float] = {name: m for name, (_, m) in _TABLE3.items() if m is not None}

PRESETS: dict[str, ModelConfig] = {name: cfg for name, (cfg, _) in _TABLE3.items()}
# §6.3: "a 4-layer transformer with d_model = 1024" and a 16K vocabulary for WSJ only; "all other
# parameters remained unchanged from the English-to-German base translation model" (the paper's
# sentence, which the condensed seed 002 leaves out): 8 heads, so d_k = d_v = 128, and d_ff 2048.
PRESETS["parse"] = dataclasses.replace(PRESETS["base"], n_layers=4, d_model=1024, vocab_size=16000)
# Small models that train on a 2-core CPU in minutes; same architecture, smaller numbers.
PRESETS["tiny"] = ModelConfig(
    vocab_size=8000, d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.1, max_len=512
)
PRESETS["small"] = ModelConfig(
    vocab_size=8000, d_model=256, n_heads=4, d_ff=1024, n_layers=3, dropout=0.1, max_len=512
)


@dataclass(frozen=True)
class Recipe:
    """A named way to train: changes to a preset's model (`model`, ModelConfig fields) and to the
    training config (`train`, TrainConfig fields; `bf16`, those of a run that trains in bf16),
    applied under any option given explicitly.
    "paper" is §3.1 and §5 as written; any other recipe deviates from the paper, and `about`
    says where."""

    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    bf16: dict = field(default_factory=dict)
    about: str = ""

    def train_changes(self, under: dict, given: dict, processes: int = 1) -> dict:
        """`train`, and `bf16` as well for a run that trains in bf16 in one process (a bf16 copy
        of the model trains in one process: aiayn.train.TrainStep). The run's precision is the
        one the TrainConfig fields `under` the recipe, the recipe's and those `given` over it make."""
        precision = {**under, **self.train, **given}.get("precision", TrainConfig.precision)
        return {**self.train, **(self.bf16 if precision == "bf16" and processes == 1 else {})}


# Measured by benchmarks/learning_curve.py (docs/learning-curve-amd-epyc.md): at equal steps the
# paper's post-norm model learns about half as much as the same model in pre-norm form, and its
# translations loop in the first thousands of steps. In bf16, a bf16 copy of the model takes the
# demo's steps faster than autocast does and learns as much per step (the fourth 40-minute run).
RECIPES: dict[str, Recipe] = {
    "paper": Recipe(about="§3.1 and §5 as written: post-norm residual blocks LayerNorm(x + Sublayer(x))"),
    "fast": Recipe(
        model={"norm_first": True},
        bf16={"bf16_weights": True},
        about="pre-norm residual blocks x + Sublayer(LayerNorm(x)) and a final LayerNorm on each stack "
              "(not the paper's §3.1): learns about twice as much per step on a small corpus; in bf16, a "
              "bf16 copy of the model trains (fp32 master weights for Adam) instead of autocast"),
}


def recipe(name: str) -> Recipe:
    """The recipe called `name`, with an error that lists the known names."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}") from None


# `aiayn demo`'s recipe, for a budget of minutes on a 2-core CPU: the budget allows a thousand
# steps or so, so the warm-up is short and batches are small; everything else is §5's. Its knobs
# are the winners of benchmarks/demo_recipe.py, a search for the best dev BLEU after 10 minutes
# (docs/demo-recipe-amd-epyc.md). Checkpoints every 50 steps, so that the last 5, which the demo
# averages (§6.1), span the end of the run.
DEMO_RECIPE: dict = dict(corpus="bible-en-es", max_tokens=2000, warmup_steps=300, lr_scale=0.5, max_steps=1_000_000,
                         save_every=50, save_minutes=2.0, keep_last=5, log_every=25, eval_every=200,
                         eval_bleu_sentences=100)
DEMO_AVERAGE_LAST = 5  # checkpoints the demo averages before it translates (§6.1)


# The search's model knobs, applied to the demo's preset: a smaller vocabulary (cheaper output
# projection, more steps in the budget) and no dropout (ten minutes are about three epochs).
DEMO_MODEL_CHANGES: dict = dict(vocab_size=4000, dropout=0.0)


DEMO_RECIPE_NAME = "fast"  # the recipe `aiayn demo` trains with unless told otherwise


def demo_model(preset_name: str = "small", recipe_name: str = DEMO_RECIPE_NAME) -> ModelConfig:
    """The model `aiayn demo` trains: the preset with the search's changes and the recipe's. A
    preset whose dropout is not base's (Table 3's D1 and D2 vary P_drop; big's is 0.3) keeps it:
    it is what that row is about (found in review: D1, D2 and base made one demo model)."""
    changes = dict(DEMO_MODEL_CHANGES)
    if preset(preset_name).dropout != PRESETS["base"].dropout:
        changes.pop("dropout")
    return dataclasses.replace(preset(preset_name), **changes, **recipe(recipe_name).model)


_RUN_LENGTH = ("max_steps", "keep_last")  # how long a run trains and what it keeps: each run's own


def preset_training(name: str) -> dict:
    """A Table 3 row's changes to training other than how long it runs (D3's and D4's ε_ls): what
    a run on a time budget (the demo) takes from `--preset NAME`."""
    return {field: value for field, value in TRAIN_OVERRIDES.get(name, {}).items() if field not in _RUN_LENGTH}


def demo_training(recipe_name: str = DEMO_RECIPE_NAME, **changes) -> TrainConfig:
    """The training config `aiayn demo` uses: DEMO_RECIPE with the recipe's changes, then `changes`."""
    return TrainConfig(**{**DEMO_RECIPE, **recipe(recipe_name).train_changes(DEMO_RECIPE, changes), **changes})


DECODE_PRESETS: dict[str, DecodeConfig] = {
    "translate": DecodeConfig(),
    # §6.3: "We increased the maximum output length to input length + 300. We used a beam size of
    # 21 and α = 0.3 for both WSJ only and the semi-supervised setting."
    "parse": DecodeConfig(beam=21, alpha=0.3, extra_len=300),
    # The dev BLEU logged during training: greedy, so that validation stays a small part of a step
    # budget (beam search is for the final test).
    "validate": DecodeConfig(beam=1),
}


def check_model_config(config) -> None:
    """A model is built from a ModelConfig: anything else is a one-line TypeError (found in review:
    a dict or a preset's name was an AttributeError deep in the model)."""
    if not isinstance(config, ModelConfig):
        hint = "ModelConfig.from_dict(values)" if isinstance(config, dict) else "PRESETS[name]" if isinstance(config, str) \
            else "ModelConfig(...)"
        raise TypeError(f"a model is built from a ModelConfig ({hint}), not a {type(config).__name__}")


def check_whole(least: Optional[int] = None, **values) -> None:
    """A one-line TypeError naming the first of `values` (name=value) that is no whole number: the
    Python API's numbers met comparisons deep inside otherwise (found in review: "'<' not
    supported between 'str' and 'int'", a TypeError from numpy for seed=None); a ValueError for
    one below `least`."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} takes a whole number, not {value!r}")
        if least is not None and value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")


def preset(name: str) -> ModelConfig:
    """The preset called `name`, with an error that lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None


def check_resumed(given_preset: Optional[str], model_config: ModelConfig, model_overrides: dict,
                  training: TrainConfig, train_overrides: dict, where: object) -> None:
    """A resumed run keeps its model and its training. Refused: model options that change it; a
    `--preset NAME` (`given_preset`, None where none was named) of another model (the vocabulary,
    the data's, and norm_first, the recipe's, aside); and one that trains otherwise (D3's and
    D4's ε_ls in TRAIN_OVERRIDES, where the model cannot tell them from base) where the options
    given do not set those fields: the run would not be the preset asked for. Not big's steps and
    checkpoints kept, which a run resumed with --max-steps has changed for good.
    `where`: the run's model config, to see."""
    own = {"vocab_size": model_config.vocab_size, "norm_first": model_config.norm_first,
           "attention_bias": model_config.attention_bias}  # (a run begun before the paper's bias-free default)
    if dataclasses.replace(model_config, **model_overrides) != model_config or (
            given_preset and dataclasses.replace(preset(given_preset), **{**model_overrides, **own}) != model_config):
        raise ValueError(f"a resumed run keeps its model; drop the model options and any --preset of another (see {where})")
    for name, value in preset_training(given_preset or "").items():  # not how long: the run's own, options change it
        if name not in train_overrides and getattr(training, name) != value:
            raise ValueError(f"--preset {given_preset} trains with {_flag(name)} {value}, this run with "
                             f"{getattr(training, name)}; a resumed run keeps its training: give "
                             f"--{name.replace('_', '-')} {value} to change it, or drop --preset")


# --------------------------------------------------------------------------------------------
# The options of the commands: each `aiayn` subcommand's flags are made from one of these
# (aiayn.cli), so a default is written once, here. `help` says what a field does; `positional`
# makes it an argument rather than a --flag; `least`/`most` bound a number (checked by
# `check_options`, which the CLI calls: nan and inf fail too).


MAX_INPUT_TOKENS = 1024  # `aiayn translate`: a longer line is cut to this many tokens
MAX_OUTPUT_LEN = 1024  # the longest output a request to `aiayn serve` may ask for
MAX_WAIT_MS_LIMIT = 10_000.0  # the most a server's max_wait_ms may be: a lone request waits that long at worst
# The rates a server's clients may be held to (--req-limit, a key's own): a rate nearer 0 made a
# wait of more seconds than a number holds (found by a misuse hunt: `1e-310` was a 500 to every
# request after the first).
REQUESTS_PER_MINUTE = (0.001, 1e9)


# The names a shell user gives standard output by: the lines go to stdout, as without --output.
STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")


@dataclass(frozen=True, kw_only=True)
class FileDecodeOptions:
    """`aiayn translate` and `aiayn parse`: one sentence a line, streamed through a model."""

    run_dir: str = _option(help="a run folder, a checkpoint or an averaged model folder", positional=True)
    input: Optional[str] = _option(None, "input file; stdin when not given, or -")
    output: Optional[str] = _option(None, "output file; stdout when not given, or -")
    max_input_tokens: int = _option(MAX_INPUT_TOKENS, "longer lines are cut", least=1)
    device: str = _option("auto", "auto, cpu, cuda, cuda:N")
    resume: bool = _option(False, "continue OUTPUT.partial, left by an interrupted run, with the same input")
    force: bool = _option(False, "replace an existing --output")

    def __post_init__(self) -> None:
        if self.output in STDOUT_NAMES:  # as --input - is stdin (found in review: --force renamed a file over /dev/stdout)
            object.__setattr__(self, "output", None)
        if self.output is not None and (not self.output or self.output.endswith("/") or Path(self.output).name in ("", ".", "..")):
            raise ValueError(f"--output names a file (or - for stdout), got {self.output!r}")  # "" went to stdout
        if self.resume and self.force:
            raise ValueError("--resume continues an output and --force translates it anew: give one of them")
        if self.resume and self.output is None:  # stdout cannot be continued
            raise ValueError("--resume continues the file of --output; without one the lines go to stdout")


@dataclass(frozen=True, kw_only=True)
class TranslateFileOptions(FileDecodeOptions):
    """`aiayn translate`: the options of FileDecodeOptions, and lines that may be paragraphs
    (`aiayn parse` reads one tokenized sentence a line)."""

    split_sentences: bool = _option(False, "a line is a paragraph: translate it sentence by sentence (aiayn.sentences)")
    lang: Optional[str] = _option(None, "the input's language, for --split-sentences (default: the run's source, else en)",
                                  language=True)
    n_best: int = _option(1, "write each line's N best translations, best first, N lines per input line (N ≤ --beam)",
                          least=1, metavar="N")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lang is not None and not self.split_sentences:  # (found in review: taken, and used for nothing)
            raise ValueError("--lang is the language --split-sentences splits by: add --split-sentences, or drop --lang")
        if self.n_best > 1 and self.split_sentences:
            raise ValueError("--n-best translates whole lines: the sentences of a paragraph have no alternatives "
                             "together; drop --split-sentences")


@dataclass(frozen=True, kw_only=True)
class PreprocessOptions:
    """`aiayn preprocess`: a corpus encoded once into a memory-mapped DATA_DIR (aiayn.store)."""

    corpus: Optional[str] = _option(None, "a built-in name, a folder, a .tsv or .parquet file (as train --corpus)")
    out: Optional[str] = _option(None, "the DATA_DIR to write")
    verify: Optional[str] = _option(None, "instead: check every byte of DATA_DIR against the SHA-256 its manifest records",
                                    metavar="DATA_DIR")
    src_lang: Optional[str] = _option(None, "source language (a folder's file suffix, a Parquet translation key)")
    tgt_lang: Optional[str] = _option(None, "target language")
    vocab_size: Optional[int] = _option(None, f"shared BPE vocabulary (default {ModelConfig.vocab_size:,}, §5.1)", least=1)
    tokenizer: Optional[str] = _option(None, "use this model or run folder's tokenizer instead of training one (fine-tuning)")
    # SentencePiece learns its merges from a random sample of this many sentences (source and
    # target together), so the time and memory of that step stop growing with the corpus: ~2/9
    # of WMT14 en-de's 9M sentences, ~3% of en-fr's 72M.
    sample_sentences: int = _option(2_000_000, "sentences the tokenizer learns from, drawn at random", least=1)
    max_sentence_tokens: int = _option(TrainConfig.max_sentence_tokens, "leave out training pairs longer than this", least=1)
    workers: Optional[int] = _option(None, "encoding threads (default: every core)", least=1)
    force: bool = _option(False, "replace an existing --out, whole")


@dataclass(frozen=True, kw_only=True)
class AverageOptions:
    """`aiayn average`: §6.1's mean of a run's last checkpoints, or of those of given steps."""

    run_dir: str = _option(help="the run folder", positional=True)
    last: Optional[int] = _option(None, "how many of the last (default: as many as the run keeps, --keep-last; "
                                        "§6.1 averages 5 for base, 20 for big)",
                                  least=1)
    steps: Optional[list[int]] = _option(None, "the checkpoints of these steps instead, e.g. 98000 99000 100000",
                                         nargs="+", metavar="STEP", least=0)
    out: str = _option(help="the model folder to write")
    force: bool = _option(False, "replace an existing --out")


@dataclass(frozen=True, kw_only=True)
class AttentionOptions:
    """`aiayn attention`: Figures 3-5 for one sentence."""

    run_dir: str = _option(help="a run folder, a checkpoint or a model folder", positional=True)
    sentence: str = _option(help="the sentence to translate and draw")
    out: str = _option("attention", "folder for the PNG files")
    device: str = _option("auto", "auto, cpu, cuda, cuda:N")
    # Each head's map has a row and a column per token, so the figures grow with the square of the
    # length (400 tokens took 385 s and 5.6 GB), and past a hundred or so are unreadable.
    max_tokens: int = _option(100, "refuse a sentence or translation longer than this", least=1)
    force: bool = _option(False, "replace an existing --out folder")


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """`aiayn demo`: train on bible-en-es for a time budget, translate the test books, score."""

    minutes: float = _option(10.0, "training time budget", above=0)
    out: str = _option("runs/demo", "run folder (reused if present)")
    preset: str = _option("small", "model preset (trained without dropout, unless its dropout is not base's: D1, D2, big)",
                          choices=lambda: sorted(PRESETS))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _option(
        "auto", "training and decoding; auto: bf16 where the device computes it in hardware (a CPU with "
                "AVX-512 or AMX, a GPU), else fp32")
    recipe: str = _option("fast", "a new run's recipe: fast (pre-norm; in bf16 a bf16 copy of the model) or paper (§3.1's post-norm)",
                          choices=lambda: sorted(RECIPES))
    seed: int = _option(1, "random seed", least=0, most=SEED_LIMIT - 1)
    test_sentences: Optional[int] = _option(None, "translate only the first N test verses", least=1)


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """`aiayn serve`: the HTTP server (aiayn.serve) and the limits that keep it standing."""

    run_dir: str = _option(help="a run folder, a checkpoint or a model folder", positional=True, metavar="RUN_OR_MODEL_DIR")
    host: str = _option("127.0.0.1", "address to listen on (127.0.0.1: this machine only)")
    port: int = _option(8080, "port (0 picks a free one)", least=0, most=65535)
    device: str = _option("auto", "auto, cpu, cuda, cuda:N")
    # How long an idle decoder, once woken by a request, waits for others to start with it. Under
    # load requests join the running search at its next step, so this only costs a lone request
    # milliseconds.
    max_wait_ms: float = _option(5.0, "how long a request at an idle server waits for others to start with it",
                                 least=0, most=MAX_WAIT_MS_LIMIT)
    max_queue: int = _option(256, "texts waiting before requests get 503", least=1)
    max_texts: int = _option(64, "texts in one request", least=1)
    # Keeps a request's decoding time and attention maps bounded.
    max_input_tokens: int = _option(256, "tokens in one text", least=1)
    # What one request may hold in memory (aiayn.serve.cost): 256 MiB together, for any model.
    max_batch_mib: float = _option(128.0, "decoding state of the texts decoding at once: beam search's keys, "
                                   "values and logits", above=0, most=1 << 20)
    max_attention_mib: float = _option(128.0, "attention maps of one answer", above=0, most=1 << 20)
    max_connections: int = _option(256, "open connections; over it idle ones are closed, else 503", least=1)
    # A request must arrive whole within this many seconds of its first byte, or of its
    # connection's opening; a slower one gets 408 and its connection is closed.
    read_timeout: float = _option(10.0, "seconds a request may take to arrive whole, else 408", above=0, most=3600)
    drain_seconds: float = _option(30.0, "on SIGTERM or Ctrl-C, decode the queue for this long, then answer the rest 503",
                                   above=0, most=3600)
    access_log: bool = _option(False, "log every request")
    # A process of its own per worker, the CPU's threads shared among them (aiayn.serve.workers):
    # concurrent requests decode side by side; each worker holds a copy of the model.
    workers: int = _option(1, "decoding processes, each with a copy of the model and its share of the CPU's threads",
                           least=1, most=64)
    # The LibreTranslate API (aiayn.serve.libre) names the model's languages; a run folder records them.
    source_lang: Optional[str] = _option(None, "the model's source language, e.g. en (default: as its run folder says)",
                                         language=True)
    target_lang: Optional[str] = _option(None, "the model's target language, e.g. es (default: as its run folder says)",
                                         language=True)
    api_keys: Optional[str] = _option(None, "a file of API keys, one a line, each optionally with its requests per "
                                      "minute: every translation then needs one (aiayn.serve.limits)", metavar="FILE")
    req_limit: Optional[float] = _option(None, "requests per minute from one address (default: no limit)",
                                         least=REQUESTS_PER_MINUTE[0], most=REQUESTS_PER_MINUTE[1])
    # uvicorn would trust X-Forwarded-For from 127.0.0.1 by default: any local process could then
    # pass as any address to --req-limit. Only the proxies named here are believed.
    forwarded_allow_ips: Optional[str] = _option(None, "proxies whose X-Forwarded-For names the client's address for "
                                                 "--req-limit, comma-separated, e.g. 127.0.0.1 behind a proxy on this "
                                                 "machine (default: none, every request's own address counts)",
                                                 metavar="IPS")
    # A reverse proxy on this machine that passes its clients' Host on (Caddy's default) reaches a
    # loopback server by a name it must be told (aiayn.serve.origins).
    allowed_hosts: Optional[str] = _option(None, "host names a server on a loopback address also answers to, "
                                           "comma-separated, e.g. translate.example.com behind a proxy on this machine "
                                           "that passes its Host on (on another address any name is answered)",
                                           metavar="NAMES")
    # LibreTranslate answers every site's pages; aiayn those named (aiayn.serve.origins).
    cors_origins: Optional[str] = _option(None, "sites whose web pages may call this server from a browser (CORS), "
                                          "comma-separated origins, e.g. http://localhost:3000, or * for every site "
                                          "(default: none; browser extensions and non-browser clients need none)",
                                          metavar="ORIGINS")


@dataclass(frozen=True, kw_only=True)
class InfoOptions:
    """`aiayn info`: a preset's configuration, parameters and FLOPs per token."""

    preset: str = _option("base", "model preset: base, big, a Table 3 row (A1 ... E), tiny, small, parse")
    length: int = _option(32, "sentence length for the FLOPs count", least=1)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """`aiayn train`: where the run goes and what it starts from (with ModelConfig's and
    TrainConfig's fields as overrides)."""

    preset: Optional[str] = _option(None, "model preset (default base): base, big, a Table 3 row (A1 ... E), tiny, small, "
                                          "parse; a resumed run keeps its own (another is refused)")
    out: str = _option(help="the run folder: checkpoints, log.jsonl, loss.png, model/")
    resume: bool = _option(False, "continue the run in --out from its last checkpoint")
    recipe: Optional[str] = _option(None, "a new run's recipe (default paper): paper, §3.1 and §5 as written; fast: pre-norm (and in bf16 "
                                    "a bf16 copy of the model), learns more per step (a deviation; see the README)",
                                    choices=lambda: sorted(RECIPES))


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """`aiayn import-hf` and `export-hf`: a model from one format into another."""

    source: str = _option(help="the folder to read", positional=True, metavar="IN_DIR")
    out: str = _option(help="the folder to write", positional=True, metavar="OUT")
    force: bool = _option(False, "replace an existing OUT, whole")


# CTranslate2's weight types (ctranslate2.converters.Converter's --quantization).
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


@dataclass(frozen=True, kw_only=True)
class Ct2Options:
    """`aiayn export-ct2`: a CTranslate2 model folder, its tokenizer beside it."""

    source: str = _option(help="a run folder, a checkpoint or a model folder", positional=True, metavar="RUN_DIR")
    out: str = _option(help="the folder to write", positional=True, metavar="OUT")
    quantization: Optional[str] = _option(None, "the weights' type in CTranslate2 (default: as they are)",
                                          choices=lambda: CT2_QUANTIZATIONS)
    force: bool = _option(False, "replace an existing OUT, whole")


@dataclass(frozen=True, kw_only=True)
class ArgosOptions:
    """`aiayn export-argos`: an Argos Translate package, for LibreTranslate and argostranslate."""

    source: str = _option(help="a run folder, a checkpoint or a model folder", positional=True, metavar="RUN_DIR")
    out: str = _option(help="the package to write, e.g. en_es.argosmodel", positional=True, metavar="OUT")
    source_lang: Optional[str] = _option(None, "the model's source language (default: as its run folder says)",
                                         language=True)
    target_lang: Optional[str] = _option(None, "the model's target language (default: as its run folder says)",
                                         language=True)
    force: bool = _option(False, "replace an existing OUT")


@dataclass(frozen=True, kw_only=True)
class CorpusExportOptions:
    """`aiayn corpus export`: one split of a corpus as two plain-text files."""

    name: str = _option(help="a built-in corpus name or a path", positional=True)
    split: str = _option("test", "train, dev or test")
    out: str = _option(help="folder for SPLIT.SRC and SPLIT.TGT")
    src_lang: Optional[str] = _option(None, "the source language: a folder's file suffix, a TSV's first column")
    tgt_lang: Optional[str] = _option(None, "the target language: a folder's file suffix, a TSV's second column")
    force: bool = _option(False, "replace existing files")


@dataclass(frozen=True, kw_only=True)
class ScoreOptions:
    """`aiayn score`: BLEU and chrF of hypotheses against references, or EVALB F1 of trees."""

    ref: str = _option(help="reference file: one sentence a line (with --parse, bracketed trees)")
    hyp: Optional[str] = _option(None, "hypothesis file, as --ref (default: stdin)")
    lang: str = _option("en", "target language: the paper protocol's Moses tokenizer, and sacreBLEU's for zh, ja, ko")
    parse: bool = _option(False, "score bracketed trees (F1, EVALB conventions)")


@dataclass(frozen=True, kw_only=True)
class Table3Options:
    """`aiayn experiment table3`: Table 3 in miniature (aiayn.experiment)."""

    out: str = _option(help="experiment folder (continued when it holds this experiment)")
    scale: str = _option("small", "miniature size: tiny or small (small: about two hours on a 2-core CPU)")
    steps: Optional[int] = _option(None, "training steps of every row (default: the scale's)", least=1)
    rows: Optional[list[str]] = _option(None, "rows or groups to run (default all), e.g. base A1 C", nargs="+")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _option(
        "auto", "training precision; auto: bf16 where the device computes it in hardware, else fp32")
    seed: int = _option(1, "random seed", least=0, most=SEED_LIMIT - 2)
    corpus: str = _option("bible-en-es", "corpus")
    vocab_size: Optional[int] = _option(None, "shared BPE vocabulary of every row (default: the scale's; a small "
                                        "--corpus allows fewer)", least=1)
    src_lang: Optional[str] = _option(None, "source language of --corpus, where its files do not name it",
                                      language=True)
    tgt_lang: Optional[str] = _option(None, "target language of --corpus", language=True)


SERVE = ServeOptions(run_dir="")  # the server's defaults, for code that runs it without the CLI


# ISO 639 letters, then BCP 47's script or region subtags: en, yue, pt-BR, zh-Hans, sr_Latn.
_LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*")


# Argos Translate's codes for three languages, which LibreTranslate (since 1.7) also takes as the
# standard's: its packages are named by Argos's.
ARGOS_CODES = {"zh-hans": "zh", "zh-hant": "zt", "pt-br": "pb"}


def argos_code(code: str) -> str:
    """A language code as Argos Translate and LibreTranslate compare them: lower case, and
    pt-BR, zh-Hant and zh-Hans as Argos's pb, zt and zh."""
    return ARGOS_CODES.get(code.lower(), code.lower())


def is_language_code(value) -> bool:
    """Whether `value` is written as a language code: en, yue, pt-BR, zh-Hans (not "english")."""
    return isinstance(value, str) and _LANGUAGE_CODE.fullmatch(value) is not None


def _in_bounds(value, meta) -> bool:
    """Whether `value` is within a field's `least`, `above` and `most` (true for what is no number)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    least, above, most = meta.get("least"), meta.get("above"), meta.get("most")
    return (least is None or value >= least) and (above is None or value > above) and (most is None or value <= most)


def check_options(options) -> None:
    """A one-line ValueError naming the first field out of its bounds (`least`, `above`,
    `most` metadata; nan and inf fail too), or not a language code (`language`): sentencex
    splits by its default rules for a code it has no rules of, and LibreTranslate's clients ask
    for codes, so a name ("english") would otherwise be taken for a code without a word."""
    for f in dataclasses.fields(options):
        value, meta = getattr(options, f.name), f.metadata
        if f.name == "out" and value == "":  # would be the current folder (found in review)
            raise ValueError(f"{meta.get('metavar', '--out')} is empty: name the folder or file to write")
        if f.name == "corpus" and value == "":  # was read as the current folder (found in review)
            raise ValueError("--corpus is empty: name a corpus, or its file or folder")
        if meta.get("language") and value is not None and not is_language_code(value):
            raise ValueError(f"--{f.name.replace('_', '-')} takes a language code (en, de, pt-BR), got {value!r}")
        if isinstance(value, list):  # each number of a list (average --steps): the first out of bounds
            value = next((v for v in value if not _in_bounds(v, meta)), None)
        if _in_bounds(value, meta):
            continue
        least, above, most = meta.get("least"), meta.get("above"), meta.get("most")
        flag = f"--{f.name.replace('_', '-')}"
        most = int(most) if isinstance(most, float) and most.is_integer() else most  # 1e9 as 1,000,000,000
        if least is not None and most is not None:
            raise ValueError(f"{flag} must be between {least:g} and {most:,}, got {value}")  # a seed's 2^64 - 2 whole
        if above is not None and most is not None:
            raise ValueError(f"{flag} must be above {above:g} and at most {most:,}, got {value}")
        if least is not None:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
        raise ValueError(f"{flag} must be above {above}, got {value}" if above is not None
                         else f"{flag} must be at most {most:,}, got {value}")


__all__ = ["ModelConfig", "TrainConfig", "DecodeConfig", "DECODE_PRESETS", "DEMO_AVERAGE_LAST", "DEMO_MODEL_CHANGES", "DEMO_RECIPE", "DEMO_RECIPE_NAME", "demo_model", "demo_training", "preset_training", "Recipe", "RECIPES", "recipe", "PRESETS", "PAPER_PARAMS_M", "TRAIN_OVERRIDES", "preset"]
