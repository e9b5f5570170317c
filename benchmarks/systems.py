"""The systems compared, built to one shape, behind one small interface.

Shape: Transformer-base (§3, Table 3 "base"): 6 + 6 layers, d_model 512, 8 heads, d_ff 2048,
post-norm, ReLU, sinusoidal positions, embeddings × √d_model, one 8,000-token vocabulary shared
by source, target and the output projection, dropout 0.1 on residuals and embeddings only; or,
after `use_model("big")`, Transformer-big (d_model 1024, 16 heads, d_ff 4096, dropout 0.3).
Weights are random (fixed seed); nothing is downloaded.

Training batches come in two kinds, the same for every system: the fixed batch of 64 pairs of
32 + 32 tokens (`training_batch`), and real batch shapes (`corpus_shapes`): the sentence lengths
of the built-in corpus cut into token-budget batches by aiayn's own batching, filled with
random ids (`shaped_batch`) and padded.

Every system offers
    train_step(src, tgt_in, tgt_out)   one Adam step on a batch (label smoothing 0.1)
    decode(sources, beam)              output ids of each source, exactly OUT_LEN tokens each
where tensors and ids follow the system's own special ids (`specials`): aiayn and the
torch.nn.Transformer peer use pad 0 / BOS 1 / EOS 2, Marian (and CTranslate2) eos 0 / pad 7,999,
with the pad as decoder start token. The content ids (`content_ids`, `decode_sources`) are the
same for all, and avoid every special id of both conventions.

Peers (transformers, ctranslate2) are imported where they are built, so that a process measuring
one system loads only that system's libraries.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.batching import Batch, make_batches, within_length
from aiayn.config import PRESETS, DecodeConfig, ModelConfig, TrainConfig
from aiayn.corpora import load_corpus
from aiayn.device import autocast
from aiayn.flops import training_flops
from aiayn.loss import label_smoothed_nll
from aiayn.model import EncoderLayer, Transformer, sinusoidal_positions
from aiayn.optim import make_optimizer, set_lr
from aiayn.search import beam_search, greedy
from aiayn.tokenizer import Tokenizer
from aiayn.train import TrainStep
from aiayn.translate import Translator

VOCAB = 8000
MODELS = ("base", "big")  # Table 3's two named rows


def model_config(name: str) -> ModelConfig:
    """Table 3's `name` row (base or big) with the common vocabulary."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return dataclasses.replace(PRESETS[name], vocab_size=VOCAB)


CONFIG = model_config("base")  # the shape every system is built to (`use_model`)


def use_model(name: str) -> None:
    """Build every system of this process to Table 3's `name` row from now on. A process
    measures one case, so the shape is a setting of the process, like the seed."""
    global CONFIG
    CONFIG = model_config(name)

SRC_LEN = 32  # source tokens each encoder sees, EOS included
TGT_LEN = 32  # target tokens per training pair (decoder inputs BOS + 31; outputs 31 + EOS)
OUT_LEN = 32  # output tokens every decoder is forced to produce (EOS not counted)
LABEL_SMOOTHING = 0.1
LEARNING_RATE = 1e-4  # any positive rate: it does not change the cost of a step

SYSTEMS = ("aiayn", "torch", "marian", "ctranslate2")
TRAINABLE = ("aiayn", "torch", "marian")  # CTranslate2 is an inference engine
# Peers measured by their own harness in their own environment (benchmarks/peers/), training
# only, in the precisions they can train in, on the devices their harness runs on.
PEER_PRECISIONS = {"eole": ("fp32", "tf32", "bf16"), "onmt": ("fp32",)}  # OpenNMT-py 3.0.4 has no bf16
PEER_DEVICES = {"eole": ("cpu", "cuda"), "onmt": ("cpu",)}
PEER_NAMES = {"eole": "Eole 0.6.4", "onmt": "OpenNMT-py 3.0.4"}

# What differs between the systems despite the common shape: written into every result file and
# the report, so that no ratio is read without them.
FAIRNESS_NOTES = (
    "Every system runs with the same number of threads: torch.set_num_threads, OMP_NUM_THREADS and "
    "MKL_NUM_THREADS, and CTranslate2's intra_threads (inter_threads 1); weights from seed 0.",
    "All systems see the same content ids: sources of 31 ids + EOS (aiayn's translate_ids appends "
    "the EOS itself), training targets of BOS/start + 31 ids in and 31 ids + EOS out.",
    "Every system decodes exactly 32 output tokens per sentence (EOS barred before, output "
    "capped at 32; checked). aiayn.search's beam search (used by aiayn and the torch peer) runs a "
    "33rd decoder step to score the final EOS; HF generate and CTranslate2 stop at the limit "
    "without it (about 3% more decoder work for aiayn and torch at beam 4; greedy is equal).",
    "torch.nn.Transformer: dropout 0.1 on residuals and embeddings as the paper; its attention "
    "dropout and the dropout inside the feed-forward network are switched off to match the "
    "paper, aiayn and Marian. nn.Transformer adds a final LayerNorm to each stack (two more "
    "LayerNorms than the paper). It has no KV cache: each decoding step re-runs the decoder over "
    "the whole prefix (how its users decode), with aiayn's greedy and beam search around it. In "
    "bf16 its encoder's inference fast path is off: it fails under CPU autocast in torch 2.13.",
    "torch.nn.Transformer and Marian have biases on the attention projections (W^Q, W^K, W^V, W^O), "
    "which §3.2.2's and aiayn's have not (aiayn's had them before 2026-11-30): 4·d_model parameters "
    "an attention block more, a negligible share of a step.",
    "Marian (HF transformers): ReLU, scaled and tied embeddings, sinusoidal positions, post-norm "
    "(LayerNorm eps 1e-5 vs aiayn's 1e-6), plus a zero final logits bias; its decoder starts "
    "from the pad embedding. Training runs with use_cache=False. Its parameter count includes its two "
    "sinusoidal position tables (frozen, 2 × 512 × 512), which the others keep as buffers.",
    "Loss: aiayn's label_smoothed_nll (smoothing over the V-1 other tokens) vs "
    "F.cross_entropy(label_smoothing=0.1) (over all V) for the peers; both on fp32 logits "
    "outside autocast, both averaged over target tokens. Optimiser: Adam(0.9, 0.98, 1e-9) for all.",
    "Training: aiayn's step projects to the vocabulary and scores only the target positions that hold "
    "a token (aiayn.train.TrainStep), where the peers project every padded position too: a few percent "
    "of a step at these batches' padding, to aiayn's advantage; the FLOP counts exclude padding for all.",
    "Training batches: aiayn's step takes them from the host and copies them to the device itself, as "
    "its Trainer gives them (the copies are in its time: about 1 MB a 25,000-token batch); the "
    "others' batches are on the device before the clock starts.",
    "bf16 decoding: aiayn and HF Marian decode with a copy of the model whose weights are cast to bf16 "
    "once (aiayn.translate.Translator; made in the warm-up call, reused by the timed ones), with no autocast; the "
    "torch.nn.Transformer peer decodes under autocast. bf16 training is autocast for every system.",
    "fp32 and bf16 decoding on a CPU: aiayn's copy lays every linear layer's weight out once for oneDNN "
    "(aiayn.inference.PackedLinear; its process keeps the fp32 model too, in its peak memory); HF Marian and "
    "torch.nn.Transformer compute F.linear (MKL's sgemm in fp32).",
    "int8 decoding: aiayn quantizes every linear layer of a copy once (aiayn.inference.inference_copy: int8 "
    "weights with one scale per output row, activations quantized per call with one scale per tensor, "
    "FBGEMM's kernels (aiayn.inference.Int8Linear); attention, cache and softmax in fp32); CTranslate2 runs its "
    "own int8 kernels.",
    "CTranslate2 is converted from the same Marian model (same seed); its vocabulary drops the pad "
    "row (7,999 entries) and its decoder starts from a zero embedding, as for any Marian model.",
    "Eole 0.6.4 and OpenNMT-py 3.0.4 (training only) are measured by their harnesses in "
    "benchmarks/peers/, each in its own environment, on the same batch shape and model "
    "shape (base or big) built through their own configs, model builders, losses, optimizers and trainer step "
    "(not their data pipelines). Both are pre-norm (neither offers post-norm in its decoder) and "
    "add an 8,000-entry output bias. Eole's bf16 is its pure bf16 (bf16 weights and Adam states, "
    "torch-optimi's Kahan-summed Adam), against aiayn's bf16 autocast with fp32 weights; "
    "OpenNMT-py 3.0.4 cannot train in bf16. Their own notes follow below.",
    "Achieved FLOP/s count the same model FLOPs for every system (aiayn.flops.training_flops: "
    "matrix products only, backward = 2 × forward).",
    "Peak memory is the peak resident set of the whole measuring process (model, optimiser, "
    "activations, libraries) on CPU; torch.cuda.max_memory_allocated on a GPU, where "
    "CTranslate2's own allocator is not seen (reported as empty).",
)


@dataclass(frozen=True)
class Specials:
    pad: int
    start: int  # first decoder input: BOS, or Marian's pad
    eos: int


AIAYN_SPECIALS = Specials(pad=CONFIG.pad_id, start=CONFIG.bos_id, eos=CONFIG.eos_id)
MARIAN_SPECIALS = Specials(pad=VOCAB - 1, start=VOCAB - 1, eos=0)
MARIAN_UNK = 1
# Ids 0-3 are aiayn's specials (and Marian's eos and unk); VOCAB - 1 is Marian's pad.
CONTENT_LOW, CONTENT_HIGH = 4, VOCAB - 1


def content_ids(rows: int, length: int, generator: torch.Generator) -> Tensor:
    """(rows, length) random ordinary token ids, the same under every system's conventions."""
    return torch.randint(CONTENT_LOW, CONTENT_HIGH, (rows, length), generator=generator)


# A batch shape: the positions of each row, {"src": [source ids + EOS, ...], "tgt": [target ids
# + 1, ...]} (the decoder's inputs start + ids, its outputs ids + EOS); every length at least 2.
Shape = dict[str, list[int]]


def fixed_shape(rows: int) -> Shape:
    """The fixed batch: `rows` pairs of SRC_LEN + TGT_LEN positions, no padding."""
    return {"src": [SRC_LEN] * rows, "tgt": [TGT_LEN] * rows}


def batch_device(system, device: torch.device) -> torch.device:
    """Where a system's training batches are made before the clock starts: the device, or the
    host for a system whose step copies them there itself (Aiayn)."""
    return torch.device("cpu") if getattr(system, "batches_on_host", False) else device


def shaped_batch(shape: Shape, specials: Specials, device: torch.device, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(src (B, S), tgt_in (B, T), tgt_out (B, T)) of one batch shape, right-padded with the
    system's pad: row i is ids + EOS; start + ids; ids + EOS, its ids random content ids."""
    rows, src_lens, tgt_lens = len(shape["src"]), torch.tensor(shape["src"]), torch.tensor(shape["tgt"])
    generator = torch.Generator().manual_seed(seed)
    src_ids = content_ids(rows, int(src_lens.max()), generator)  # (B, S): the last column is cut by EOS or padding
    tgt_ids = content_ids(rows, int(tgt_lens.max()), generator)  # (B, T)
    src_pos, tgt_pos = torch.arange(src_ids.size(1)), torch.arange(tgt_ids.size(1))

    def place(ids: Tensor, positions: Tensor, lengths: Tensor, last: int) -> Tensor:
        """ids up to length - 1, `last` at length - 1, padding after."""
        out = ids.masked_fill(positions >= lengths.unsqueeze(1) - 1, last)
        return out.masked_fill(positions >= lengths.unsqueeze(1), specials.pad)

    src = place(src_ids, src_pos, src_lens, specials.eos)
    tgt_out = place(tgt_ids, tgt_pos, tgt_lens, specials.eos)
    tgt_in = torch.cat([torch.full((rows, 1), specials.start), tgt_ids[:, :-1]], dim=1)  # start + ids
    tgt_in = tgt_in.masked_fill(tgt_pos >= tgt_lens.unsqueeze(1), specials.pad)
    return src.to(device), tgt_in.to(device), tgt_out.to(device)


def training_batch(rows: int, specials: Specials, device: torch.device, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(src, tgt_in, tgt_out), each (rows, 32): ids + EOS; start + ids; ids + EOS."""
    return shaped_batch(fixed_shape(rows), specials, device, seed)


def target_tokens(shapes: list[Shape]) -> int:
    """The real (non-pad) target tokens of these batches: ids + EOS of every row."""
    return sum(sum(shape["tgt"]) for shape in shapes)


def flops_per_token(shapes: list[Shape], config: Optional[ModelConfig] = None) -> float:
    """Model FLOPs of a training step (aiayn.flops.training_flops, of each pair at its own
    lengths: padding is not counted) per real target token of these batches, for `config`
    (default: this process's CONFIG)."""
    config = config or CONFIG
    flops = sum(training_flops(config, s, t) for shape in shapes for s, t in zip(shape["src"], shape["tgt"]))
    return flops / target_tokens(shapes)


def training_tflops(tokens_per_s: float, shapes: Optional[list[Shape]] = None, config: Optional[ModelConfig] = None) -> float:
    """Achieved TFLOP/s of training at `tokens_per_s` real target tokens/s on `shapes` (default:
    the fixed batch): the model FLOPs (aiayn.flops.training_flops), the count every system is
    measured against."""
    return tokens_per_s * flops_per_token(shapes or [fixed_shape(1)], config) / 1e12


# The built-in corpus whose sentence lengths make the real batch shapes.
CORPUS = "bible-en-es"


def corpus_lengths(scratch: Path) -> np.ndarray:
    """(N, 2) positions (source + EOS, target + 1) of the training pairs of the built-in corpus
    under a joint SentencePiece BPE of VOCAB pieces learned from them, as `aiayn train` builds
    it (tokenizer written into `scratch`), without the pairs `aiayn train` leaves out as too long."""
    pairs = load_corpus(CORPUS).splits["train"]
    tokenizer = Tokenizer.train((text for pair in pairs for text in pair), VOCAB, scratch)
    lengths = np.array([[len(s), len(t)] for s, t in zip(tokenizer.encode_batch([p[0] for p in pairs]),
                                                         tokenizer.encode_batch([p[1] for p in pairs]))])  # (N, 2)
    return lengths[within_length(lengths, TrainConfig.max_sentence_tokens)] + 1


def corpus_shapes(lengths: np.ndarray, budget: int, count: int) -> list[Shape]:
    """`count` batch shapes that aiayn's batching (aiayn.batching.make_batches, `budget` padded
    tokens per side, seed 0, epoch 0) cuts from `lengths` (N, 2): the batches at evenly spaced
    quantiles of their longest target, so that short-sentence batches of many rows and
    long-sentence batches of few rows are both timed; in that order, shortest first."""
    batches = make_batches(lengths, budget, seed=0, epoch=0)
    by_length = sorted(batches, key=lambda rows: (int(lengths[rows, 1].max()), int(lengths[rows, 0].max()), len(rows)))
    picked = [by_length[int((i + 0.5) * len(by_length) / count)] for i in range(count)]
    return [{"src": lengths[rows, 0].tolist(), "tgt": lengths[rows, 1].tolist()} for rows in picked]


def decode_sources(sentences: int, seed: int = 1) -> list[list[int]]:
    """Source sentences of SRC_LEN - 1 content ids, without EOS (each system adds its own)."""
    return content_ids(sentences, SRC_LEN - 1, torch.Generator().manual_seed(seed)).tolist()


def check_outputs(outputs: list[list[int]], sentences: int) -> int:
    """The number of output tokens, after checking that every sentence got exactly OUT_LEN."""
    lengths = sorted({len(out) for out in outputs})
    if len(outputs) != sentences or lengths != [OUT_LEN]:
        raise AssertionError(f"expected {sentences} outputs of {OUT_LEN} tokens, got {len(outputs)} of lengths {lengths}")
    return sum(len(out) for out in outputs)


# --------------------------------------------------------------------------------------------
# PyTorch systems: what their training steps share


class _TorchSystem:
    """A model trained with Adam on `loss(logits, tgt_out)`, logits computed under autocast as
    aiayn's TrainStep does; the loss is taken outside autocast on fp32 logits."""

    specials: Specials

    def __init__(self, model: nn.Module, device: torch.device, precision: str) -> None:
        self.model = model.to(device)
        self.device = device
        self.precision = precision
        self.optimizer = make_optimizer(self.model)  # Adam(β = 0.9, 0.98, ε = 1e-9), §5.3
        set_lr(self.optimizer, LEARNING_RATE)

    def logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        raise NotImplementedError

    def loss(self, logits: Tensor, tgt_out: Tensor) -> Tensor:
        """Mean label-smoothed cross-entropy over the non-pad target tokens."""
        return F.cross_entropy(
            logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=self.specials.pad, label_smoothing=LABEL_SMOOTHING
        )

    def train_step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> None:
        self.model.train()
        with autocast(self.device, self.precision):
            logits = self.logits(src, tgt_in)  # (B, T, V)
        self.loss(logits, tgt_out).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Aiayn(_TorchSystem):
    """aiayn.model.Transformer; decoding through aiayn.translate.translate_ids (KV cache). Its
    training batches come from the host, as its Trainer's do: TrainStep finds the target
    positions and checks the ids there, and copies the batch to the device itself."""

    specials = AIAYN_SPECIALS
    batches_on_host = True

    def __init__(self, device: torch.device, precision: str, compile: bool = False, bf16_weights: bool = False,
                 cuda_graphs: bool = False) -> None:
        super().__init__(Transformer(CONFIG), device, precision)
        self.compile, self.bf16_weights, self.cuda_graphs = compile, bf16_weights, cuda_graphs
        self.step: Optional[TrainStep] = None  # made by the first training step (a decoding case has none)
        self.translator: Optional[Translator] = None  # its decoding copy is made once, in the warm-up call

    def logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def train_step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> None:
        if self.step is None:
            # The very step aiayn's Trainer takes (aiayn.train.TrainStep): with bf16 weights it runs
            # on a bf16 copy, Adam on the fp32 model.
            recipe = TrainConfig(precision=self.precision, label_smoothing=LABEL_SMOOTHING, compile=self.compile,
                                 bf16_weights=self.bf16_weights, device=str(self.device))
            self.step = TrainStep(self.model, self.optimizer, recipe, self.device)
        self.model.train()
        tokens = int((tgt_out != CONFIG.pad_id).sum())
        self.step([Batch(src, tgt_in, tgt_out, int((src != CONFIG.pad_id).sum()), tokens)], tokens)

    def loss(self, logits: Tensor, tgt_out: Tensor) -> Tensor:
        loss, _ = label_smoothed_nll(logits, tgt_out, LABEL_SMOOTHING, CONFIG.pad_id)  # summed
        return loss / (tgt_out != CONFIG.pad_id).sum()

    def decode(self, sources: list[list[int]], beam: int) -> list[list[int]]:
        length = len(sources[0])
        assert all(len(s) == length for s in sources), "equal source lengths keep the batch free of padding"
        if self.translator is None:  # weights cast once, as for Marian
            self.translator = Translator(self.model.eval(), None,
                                         DecodeConfig(precision=self.precision, cuda_graphs=self.cuda_graphs))
        return self.translator.translate_ids(
            sources, beam=beam,
            batch_tokens=len(sources) * (length + 1) * beam,  # every sentence in one batch
            extra_len=OUT_LEN - length,  # the output limit is source length + extra_len
            min_len=OUT_LEN,
        )


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with what it leaves to its users: scaled embeddings, sinusoidal
    positions, embedding dropout and the output projection, tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        c = CONFIG
        self.scale = c.d_model**0.5
        self.embed = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        nn.init.normal_(self.embed.weight, std=c.d_model**-0.5)
        self.register_buffer("positions", sinusoidal_positions(c.max_len, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(
            d_model=c.d_model, nhead=c.n_heads, num_encoder_layers=c.n_layers, num_decoder_layers=c.n_layers,
            dim_feedforward=c.d_ff, dropout=c.dropout, batch_first=True,
        )
        # nn.Transformer's dropout also drops attention weights and the FFN's hidden units; the
        # paper (and aiayn, and Marian here) drop neither, so those two are switched off.
        for layer in (*self.transformer.encoder.layers, *self.transformer.decoder.layers):
            layer.dropout = nn.Identity()  # the one inside the feed-forward network
            layer.self_attn.dropout = 0.0
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = 0.0

    def _embed(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.embed(tokens) * self.scale + self.positions[: tokens.size(1)])

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> (memory (B, S, d_model), padding mask (B, S), True = pad)."""
        pad = src == CONFIG.pad_id
        return self.transformer.encoder(self._embed(src), src_key_padding_mask=pad), pad

    def decode(self, tgt: Tensor, memory: Tensor, memory_pad: Tensor, tgt_pad: Optional[Tensor] = None) -> Tensor:
        """tgt (B, T) -> logits (B, T, V), causally masked."""
        length = tgt.size(1)
        # Boolean like the padding masks (mixing float and bool masks is deprecated); in
        # nn.Transformer's convention True = may NOT attend, the opposite of aiayn's.
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt.device).triu(diagonal=1)
        hidden = self.transformer.decoder(
            self._embed(tgt), memory, tgt_mask=causal, tgt_is_causal=True,
            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=memory_pad,
        )
        return F.linear(hidden, self.embed.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        memory, memory_pad = self.encode(src)
        return self.decode(tgt_in, memory, memory_pad, tgt_in == CONFIG.pad_id)


class _PrefixStep:
    """aiayn.search's step/reorder interface over TorchTransformer, which has no KV cache: each
    step re-runs the decoder over the whole prefix. State: memory (B, S, d_model), its padding
    mask (B, S), prefix (B, t) tokens so far (BOS first), reordered together."""

    def __init__(self, model: TorchTransformer, src: Tensor) -> None:
        self.model = model
        self.memory, self.memory_pad = model.encode(src)
        self.prefix = src.new_empty(src.size(0), 0)

    def step(self, tokens: Tensor) -> Tensor:
        self.prefix = torch.cat([self.prefix, tokens.to(self.prefix.device).unsqueeze(1)], dim=1)
        logits = self.model.decode(self.prefix, self.memory, self.memory_pad)[:, -1]  # (B, V)
        return torch.log_softmax(logits.float(), dim=-1)

    def reorder(self, rows: Tensor, sentences: Tensor, beam: int) -> None:
        self.memory = self.memory.index_select(0, rows)
        self.memory_pad = self.memory_pad.index_select(0, rows)
        self.prefix = self.prefix.index_select(0, rows)


class TorchPeer(_TorchSystem):
    specials = AIAYN_SPECIALS

    def __init__(self, device: torch.device, precision: str) -> None:
        super().__init__(TorchTransformer(), device, precision)
        if precision != "fp32":
            # The encoder's inference fast path fails under CPU autocast (torch 2.13: "expected
            # scalar type Float but found BFloat16"), so mixed precision runs without it.
            torch.backends.mha.set_fastpath_enabled(False)

    def logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    @torch.no_grad()
    def decode(self, sources: list[list[int]], beam: int) -> list[list[int]]:
        self.model.eval()
        s = self.specials
        src = torch.tensor([ids + [s.eos] for ids in sources], device=self.device)
        max_len = torch.full((len(sources),), OUT_LEN)
        with autocast(self.device, self.precision):
            stepper = _PrefixStep(self.model, src)
            if beam == 1:
                return greedy(stepper.step, stepper.reorder, s.start, s.eos, max_len, min_len=OUT_LEN)
            hypotheses = beam_search(stepper.step, stepper.reorder, s.start, s.eos, max_len, beam, min_len=OUT_LEN)
        return [h.tokens for h in hypotheses]


# --------------------------------------------------------------------------------------------
# Hugging Face Marian and CTranslate2


def marian_model():
    """A MarianMTModel of the common shape, random weights from the current torch seed."""
    from transformers import MarianConfig, MarianMTModel

    c, s = CONFIG, MARIAN_SPECIALS
    config = MarianConfig(
        vocab_size=VOCAB, d_model=c.d_model, encoder_layers=c.n_layers, decoder_layers=c.n_layers,
        encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, activation_function="relu", scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        dropout=c.dropout, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=s.pad, eos_token_id=s.eos, decoder_start_token_id=s.start,
        forced_eos_token_id=None,  # Marian's default forces EOS as the last token; we count 32 real ones
        max_position_embeddings=512,
    )
    return MarianMTModel(config)


class Marian(_TorchSystem):
    """HF MarianMTModel; decoding through model.generate (KV cache)."""

    specials = MARIAN_SPECIALS

    def __init__(self, device: torch.device, precision: str) -> None:
        super().__init__(marian_model(), device, precision)
        self.low: Optional[nn.Module] = None  # the bf16 copy that decoding uses

    def logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(
            input_ids=src, attention_mask=src != self.specials.pad, decoder_input_ids=tgt_in, use_cache=False
        ).logits

    @torch.no_grad()
    def decode(self, sources: list[list[int]], beam: int) -> list[list[int]]:
        self.model.eval()
        if self.precision == "bf16" and self.low is None:  # weights cast once, as for aiayn
            self.low = copy.deepcopy(self.model).to(torch.bfloat16)
        model = self.low if self.precision == "bf16" else self.model
        src = torch.tensor([ids + [self.specials.eos] for ids in sources], device=self.device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=src, attention_mask=src != self.specials.pad, num_beams=beam, do_sample=False,
                min_new_tokens=OUT_LEN, max_new_tokens=OUT_LEN,
            )  # (B, 1 + OUT_LEN): the decoder start token, then the output
        return out[:, 1:].tolist()


def _marian_token(i: int) -> str:
    """The vocabulary entry of id i in the Marian tokenizer written for CTranslate2."""
    return {MARIAN_SPECIALS.eos: "</s>", MARIAN_UNK: "<unk>", MARIAN_SPECIALS.pad: "<pad>"}.get(i, f"▁w{i}")


def _write_marian_tokenizer(directory: Path) -> None:
    """A minimal MarianTokenizer folder (source.spm, target.spm, vocab.json), which the CTranslate2
    converter loads for the vocabulary. The SentencePiece model is trained on a few generated
    lines: it is never used to tokenize (the benchmark feeds ids), only loaded."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    spm_path = directory / "toy.model"
    words = [f"w{i}" for i in range(200)]
    lines = (" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(500))
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_prefix=str(spm_path.with_suffix("")), vocab_size=100, minloglevel=2
    )
    vocab_path = directory / "toy-vocab.json"
    vocab_path.write_text(json.dumps({_marian_token(i): i for i in range(VOCAB)}))
    MarianTokenizer(source_spm=str(spm_path), target_spm=str(spm_path), vocab=str(vocab_path)).save_pretrained(directory)


def convert_for_ctranslate2(directory: Path, quantizations: tuple[str, ...]) -> dict[str, Path]:
    """Build the Marian model (seeded by the caller as for the Marian runs, so the weights are
    theirs), save it with a tokenizer and convert it once per quantization ("float32", "int8").
    Returns {quantization: converted model folder}."""
    import ctranslate2

    hf_dir = directory / "marian"
    hf_dir.mkdir(parents=True, exist_ok=True)
    marian_model().save_pretrained(hf_dir)
    _write_marian_tokenizer(hf_dir)
    converter = ctranslate2.converters.TransformersConverter(str(hf_dir))
    return {q: Path(converter.convert(str(directory / f"ct2-{q}"), quantization=q, force=True)) for q in quantizations}


# CTranslate2 compute types by precision label and device kind; the model is converted to the
# same type. int8 on a GPU keeps the layers it does not quantize in fp16 (CTranslate2's
# int8_float16), on a CPU in fp32.
CT2_TYPES = {"cpu": {"fp32": "float32", "int8": "int8", "bf16": "bfloat16"},
             "cuda": {"fp32": "float32", "int8": "int8_float16", "bf16": "bfloat16", "fp16": "float16"}}
DECODE_PRECISIONS = ("fp32", "bf16", "fp16", "int8")


def ctranslate2_precisions(device: torch.device) -> list[str]:
    """The precision labels CTranslate2 supports on `device` (CPUs here: fp32 and int8)."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types(device.type)
    return [label for label, kind in CT2_TYPES[device.type].items() if kind in supported]


class CTranslate2:
    """A ctranslate2.Translator over the converted Marian model; inference only."""

    specials = MARIAN_SPECIALS

    def __init__(self, model_dir: Path, device: torch.device, precision: str, threads: int) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(model_dir), device=device.type, inter_threads=1, intra_threads=threads, compute_type=CT2_TYPES[device.type][precision]
        )
        self.ids = {_marian_token(i): i for i in range(VOCAB)}

    def train_step(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> None:
        raise NotImplementedError("CTranslate2 is an inference engine")

    def decode(self, sources: list[list[int]], beam: int) -> list[list[int]]:
        batch = [[_marian_token(i) for i in ids] + ["</s>"] for ids in sources]  # Marian sources end in EOS
        results = self.translator.translate_batch(
            batch, beam_size=beam, min_decoding_length=OUT_LEN, max_decoding_length=OUT_LEN, max_batch_size=len(batch)
        )
        return [[self.ids[token] for token in r.hypotheses[0]] for r in results]


def build(system: str, device: torch.device, precision: str, threads: int, ct2_dir: Optional[Path] = None,
          compile: bool = False, bf16_weights: bool = False, cuda_graphs: bool = False):
    """The named system; callers seed torch first so that weights are the same every run."""
    if system == "aiayn":
        return Aiayn(device, precision, compile, bf16_weights, cuda_graphs)
    if compile or bf16_weights or cuda_graphs:
        raise ValueError("--compile, --bf16-weights and --cuda-graphs apply to aiayn only")
    if system == "torch":
        return TorchPeer(device, precision)
    if system == "marian":
        return Marian(device, precision)
    if system == "ctranslate2":
        if ct2_dir is None:
            raise ValueError("ctranslate2 needs the folder of its converted model")
        return CTranslate2(ct2_dir, device, precision, threads)
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


# --------------------------------------------------------------------------------------------
# The encoder layer of the sequence-length sweep


def layer_config(neighborhood: Optional[int]) -> ModelConfig:
    """CONFIG with restricted self-attention of neighbourhood r (None = full attention), with a
    clear error where aiayn does not have the option."""
    if neighborhood is None:
        return CONFIG
    if "neighborhood" not in {f.name for f in dataclasses.fields(ModelConfig)}:
        raise SystemExit(
            "this aiayn has no ModelConfig.neighborhood (restricted self-attention, Table 1): "
            "update aiayn, or run the sweep with --no-local for full attention only"
        )
    return dataclasses.replace(CONFIG, neighborhood=neighborhood)


def encoder_layer(neighborhood: Optional[int], device: torch.device) -> EncoderLayer:
    """One aiayn encoder layer of the common shape, in training mode (dropout on)."""
    return EncoderLayer(layer_config(neighborhood)).to(device).train()
