"""Presets against the paper's Table 3, and config validation."""

import dataclasses

import pytest

from aiayn.checkpoint import meta_model
from aiayn.config import PAPER_PARAMS_M, PRESETS, TRAIN_OVERRIDES, ModelConfig, preset
from aiayn.model import Transformer


def count(config: ModelConfig) -> float:
    return meta_model(Transformer, config).num_parameters() / 1e6  # shapes only, no memory


COUNTS = {name: count(config) for name, config in PRESETS.items()}

# Table 3's C1 (N = 2) lists 36M; our count is 33.6M (-6.5%). With the stated 37,000-token
# vocabulary our rows of d_model 512 sit 1.6-2.6M under the paper's (base 63.0M vs 65M), C4
# (d_model 256) 1.2M and C5 (1024) 4.2M under: a gap in proportion to d_model, as an embedding of
# about 4,000 more tokens would make, which the smallest model feels most (big, 1.2M over, is the
# exception). The per-layer arithmetic is right: the differences between rows match the paper's
# differences (test below), so C1 is held to 7% with this note.
TOLERANCE = {"C1": 0.07}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS_M))
def test_parameter_counts_match_table_3(name):
    paper = PAPER_PARAMS_M[name]
    assert abs(COUNTS[name] - paper) / paper <= TOLERANCE.get(name, 0.05), (name, COUNTS[name], paper)


@pytest.mark.parametrize("name", sorted(set(PAPER_PARAMS_M) - {"base"}))
def test_row_differences_match_table_3(name):
    """What a row adds to or removes from the base model, against what Table 3 says it does."""
    ours = COUNTS[name] - COUNTS["base"]
    paper = PAPER_PARAMS_M[name] - PAPER_PARAMS_M["base"]
    assert abs(ours - paper) <= max(1.0, 0.05 * abs(paper)), (name, ours, paper)


def test_rows_without_a_count_keep_the_base_parameters():
    for name in ("A1", "A2", "A3", "A4", "D1", "D2", "D3", "D4"):
        assert COUNTS[name] == COUNTS["base"], name
    # Row E adds one learned vector per position to the encoder and the decoder.
    assert round(COUNTS["E"] * 1e6) == round(COUNTS["base"] * 1e6) + 2 * PRESETS["E"].max_len * 512


def test_presets_name_every_row_of_table_3():
    rows = ["base", "big", "A1", "A2", "A3", "A4", "B1", "B2"] + [f"C{i}" for i in range(1, 8)]
    rows += ["D1", "D2", "D3", "D4", "E", "parse", "tiny", "small"]
    assert list(PRESETS) == rows
    assert PRESETS["A1"].head_dims == (512, 512) and PRESETS["A4"].n_heads == 32
    assert PRESETS["big"].dropout == 0.3 and PRESETS["big"].head_dims == (64, 64)
    assert PRESETS["E"].positional == "learned"
    parse = PRESETS["parse"]  # §6.3
    assert (parse.n_layers, parse.d_model, parse.vocab_size) == (4, 1024, 16000)
    # "all other parameters remained unchanged from the English-to-German base translation model"
    assert (parse.n_heads, parse.head_dims, parse.d_ff, parse.dropout) == (8, (128, 128), 2048, 0.1)
    assert TRAIN_OVERRIDES == {"big": {"max_steps": 300_000, "keep_last": 20},  # Table 3, §6.1
                               "D3": {"label_smoothing": 0.0}, "D4": {"label_smoothing": 0.2}}
    assert COUNTS["tiny"] < 1 and COUNTS["small"] < 10  # they train on a 2-core CPU


def test_replace_recomputes_default_head_sizes():
    config = dataclasses.replace(PRESETS["base"], d_model=256, vocab_size=8000)
    assert config.head_dims == (32, 32) and config.vocab_size == 8000
    assert dataclasses.replace(PRESETS["A1"], d_model=256).head_dims == (512, 512)  # explicit stays


def test_from_dict_round_trip():
    config = PRESETS["C5"]
    assert ModelConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"d_model": 100, "n_heads": 3}, "not divisible by n_heads \\(--n-heads\\) 3"),
        ({"d_model": 0}, "d_model must be a positive integer"),
        ({"dropout": 1.5}, r"dropout must be in \[0, 1\)"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"positional": "rotary"}, "positional must be one of"),
        ({"pad_id": 40000}, "outside the vocabulary"),
        ({"bos_id": 2}, "must differ"),  # BOS = EOS; BOS = pad is allowed (Marian)
        ({"unk_id": 0}, "must differ"),
        ({"d_k": -1}, "d_k must be a positive integer"),
        ({"layer_norm_eps": float("inf")}, "layer_norm_eps must be positive and finite"),  # found in review: trained
        # Each bound exactly (found by mutation: each check loosened by one, or by a case, passed every test)
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),  # zeroes every activation
        ({"attention_dropout": 1.0}, r"attention_dropout must be in \[0, 1\)"),
        ({"d_k": 0}, "d_k must be a positive integer"),
        ({"neighborhood": 0}, "neighborhood must be"),
        ({"d_model": 100, "n_heads": 3, "d_k": 40}, "not divisible"),  # d_v would be d_model // h without a word
        ({"d_model": 101, "n_heads": 1, "positional": "sinusoidal_concat"}, "even d_model"),
        ({"eos_id": 37000}, "outside the vocabulary"),  # the vocabulary's size itself
        ({"bos_id": 3}, "must differ"),  # BOS = UNK
    ],
)
def test_invalid_configs_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(PRESETS["base"], **changes)


@pytest.mark.parametrize("changes, message", [
    # Found in review: -1 failed after the data loaded, 10^23 as torch's overflow. (An empty --corpus: test_faults.)
    ({"seed": -1}, r"seed \(--seed\) must be in \[0, 2\^64\), got -1"),
    ({"seed": 10**23}, r"must be in \[0, 2\^64\)"),
    # Each bound exactly (found by mutation: each loosened passed every test)
    ({"seed": 2**64}, r"must be in \[0, 2\^64\)"),
    ({"label_smoothing": 1.0}, "label_smoothing"), ({"label_smoothing": -0.1}, "label_smoothing"),
    ({"eval_bleu_sentences": -1}, "eval_bleu_sentences"),
])
def test_invalid_training_configs_are_rejected(changes, message):
    from aiayn.config import SEED_LIMIT, TrainConfig

    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes)
    assert TrainConfig(seed=SEED_LIMIT - 1).seed == SEED_LIMIT - 1 and TrainConfig(seed=0).seed == 0


def test_heads_need_not_divide_d_model_when_sizes_are_given():
    config = ModelConfig(d_model=100, n_heads=3, d_k=40, d_v=30, vocab_size=100)
    assert config.head_dims == (40, 30)


def test_unknown_preset_lists_the_names():
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose from base, big"):
        preset("huge")


@pytest.mark.parametrize("recipe_name", ["fast", "paper"])
def test_the_demo_of_a_label_smoothing_row_trains_with_its_label_smoothing(recipe_name):
    """D3 and D4 differ from base only in ε_ls, which no model config holds: `aiayn demo --preset D3`
    trained base's (found in review). A time-budgeted run takes a row's training but not big's
    300K steps and 20 checkpoints."""
    from aiayn.config import demo_training, preset_training

    base = demo_training(recipe_name).label_smoothing
    assert base == 0.1
    assert demo_training(recipe_name, **preset_training("D3")).label_smoothing == 0.0
    assert demo_training(recipe_name, **preset_training("D4")).label_smoothing == 0.2
    assert preset_training("big") == {} and preset_training("base") == {}


def test_the_demo_of_a_dropout_row_keeps_its_dropout():
    """The demo trains without dropout (ten minutes are a few epochs), but D1 and D2 vary P_drop
    (Table 3) and big's is 0.3: those keep theirs (found in review: D1, D2 and base made one model)."""
    from aiayn.config import demo_model

    assert demo_model("small").dropout == demo_model("base").dropout == 0.0
    assert (demo_model("D1").dropout, demo_model("D2").dropout, demo_model("big").dropout) == (0.0, 0.2, 0.3)
    assert demo_model("D2").vocab_size == demo_model("base").vocab_size == 4000


def test_the_fast_recipe_trains_a_bf16_copy_only_when_the_run_trains_in_bf16():
    """The fast recipe's `bf16` changes apply in bf16 alone: bf16_weights needs bf16, and an fp32
    run or the paper's recipe keeps autocast's fp32 weights."""
    from aiayn.config import demo_training, recipe

    assert demo_training("fast", precision="bf16").bf16_weights is True
    assert demo_training("fast", precision="fp32").bf16_weights is False
    assert demo_training("paper", precision="bf16").bf16_weights is False
    assert recipe("fast").train_changes({}, {"precision": "bf16"}, processes=2) == {}  # the copy trains in one process


def test_training_defaults_are_section_5s():
    """§5.3's warmup_steps = 4000 and Adam's ε = 10^-9, §5.4's ε_ls = 0.1, §5.2's 100K steps of
    the base model, §6.1's last 5 checkpoints (found by mutation: a warm-up of 4096 passed every test)."""
    from aiayn.config import TrainConfig

    recipe = TrainConfig()
    assert (recipe.warmup_steps, recipe.adam_eps, recipe.label_smoothing, recipe.max_steps, recipe.keep_last) == \
        (4000, 1e-9, 0.1, 100_000, 5)


def test_translation_decodes_as_section_6_1_by_default():
    """§6.1: "beam search with a beam size of 4 and length penalty α = 0.6 ... maximum output
    length to input length + 50, but terminate early when possible"; no guard against loops, which
    the paper's search has not (found by mutation: extra_len 49 passed every test)."""
    from aiayn.config import DECODE_PRESETS, DecodeConfig

    for decode in (DecodeConfig(), DECODE_PRESETS["translate"]):
        assert (decode.beam, decode.alpha, decode.extra_len, decode.max_output_len) == (4, 0.6, 50, None)
        assert (decode.no_repeat_ngram_size, decode.repetition_penalty) == (0, 1.0)


def test_a_preset_that_fixes_the_head_sizes_says_so_when_the_width_changes(tmp_path):
    """`train --preset A1 --d-model 32` keeps A1's d_k = d_v = 512 (explicit values stay, as
    above): said in a note (found by an interop hunt: unsaid, a 215K-parameter "tiny" model);
    base, whose sizes follow d_model / h, and given sizes say nothing."""
    from aiayn.prepare import run_configs
    from aiayn.run import RunDir

    def said(preset_name, **overrides):
        notes = []
        config, _ = run_configs(RunDir(tmp_path / "run"), False, preset(preset_name), {}, {}, overrides, {},
                                given_preset=preset_name, echo=notes.append)
        return config.head_dims, notes

    assert said("A1", d_model=32) == ((512, 512), ["note: --preset A1 fixes d_k 512 and d_v 512 (Table 3 varies them), "
                                                   "which stay as the model's width changes; give --d-k and --d-v to "
                                                   "change them"])
    assert said("A1", d_model=32, d_k=8, d_v=8) == ((8, 8), [])
    assert said("base", d_model=32) == ((4, 4), [])
    assert said("A1") == ((512, 512), [])
