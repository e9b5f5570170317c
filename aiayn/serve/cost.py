"""What a request costs the server, in bytes of memory, so that limits can bound it.

Two things grow with a request. The decoding state of beam search (§6.1): for every hypothesis
the keys and values of every decoder layer, for each source position (encoder-decoder attention)
and each output position (self-attention), and a row of logits over the vocabulary. And, when
attention is asked for, the maps themselves: layers × heads × (S² + T² + T·S) weights per text,
held as Python floats and then as JSON until the answer is sent. Both are counted here at their
worst: the output at its length limit.

The texts decoding at once (`aiayn.serve.batcher`) add up to at most one byte budget at their
own sizes; a text whose own state is over the budget is refused. The attention of one request is
bounded on its own. With the defaults, one request holds at most SERVE.max_batch_mib +
SERVE.max_attention_mib = 256 MiB. Several requests decoding together can hold more than their
sum: continuous batching keeps every row as wide as the widest (the oldest sentence's steps so
far plus the newest one's limit, and the longest source), a padding this count leaves out.
"""

from __future__ import annotations

from typing import Optional

# Bytes of one element of the decoding cache per precision: int8 weights still keep fp32 or bf16
# activations, so int8 counts at fp32's size (the larger).
CACHE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 4}
# Logits, their log-softmax and the beam's scores over the vocabulary: three fp32 rows a hypothesis.
LOGIT_ROWS = 3
# One attention weight in an answer: a Python float in a nested list (24 + 8 bytes), its JSON text
# ("0.123," as str, then as bytes: 2 × 6), the float64 it was rounded in (8): about 56, counted
# at 80 for the allocator's own overhead. tests/test_serve.py holds the server's measured peak
# resident set under this estimate.
ATTENTION_VALUE_BYTES = 80
MIB = 1 << 20


def output_limit(source_len: int, extra_len: int, max_output_len: Optional[int]) -> int:
    """The most tokens a text's translation may take (aiayn.translate: source + extra_len, at
    most max_output_len), plus its EOS."""
    limit = source_len + extra_len
    return (limit if max_output_len is None else min(limit, max_output_len)) + 1


def decoding_bytes(config, precision: str, source_len: int, output_len: int, beam: int) -> int:
    """The decoding state of one text: `beam` hypotheses, each with keys and values in every
    decoder layer for source_len + 1 source positions and output_len output positions, and
    LOGIT_ROWS rows over the vocabulary."""
    per_position = 2 * config.n_layers * config.d_model * CACHE_BYTES[precision]  # a key and a value per layer
    return beam * ((source_len + 1 + output_len) * per_position + LOGIT_ROWS * config.vocab_size * 4)


def attention_bytes(config, source_len: int, output_len: int) -> int:
    """The attention maps of one text in an answer: every layer's and head's encoder (S × S),
    decoder (T × T) and encoder-decoder (T × S) weights, S and T counting EOS."""
    s, t = source_len + 1, output_len
    return config.n_layers * config.n_heads * (s * s + t * t + t * s) * ATTENTION_VALUE_BYTES
