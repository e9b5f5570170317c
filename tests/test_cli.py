"""The command line: output of `aiayn info`, and one-line errors for user mistakes."""

import dataclasses
import json
import subprocess
import sys

import pytest

from aiayn.cli import main
from aiayn.config import ModelConfig, TrainConfig


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_prints_config_parameters_and_flops(capsys):
    code, out, _ = run(capsys, "info", "--preset", "base")
    assert code == 0
    assert "d_model            512" in out and "d_k                64" in out
    assert "parameters         63,045,632 (63.0M)" in out
    assert "paper (Table 3)  65M" in out
    assert "training" in out and "MFLOP" in out
    assert "label_smoothing" not in out
    _, out, _ = run(capsys, "info", "--preset", "D3")  # a row whose change is in training, not in the model
    assert "label_smoothing    0.0 (training" in out
    _, out, _ = run(capsys, "info", "--preset", "big")
    assert "max_steps          300000 (training" in out and "keep_last          20 (training" in out
    _, out, _ = run(capsys, "info", "--preset", "base", "--length", "2000")
    assert "(sentence pairs of 2000 + 2000 tokens; past max_len, 1024, the longest the model takes)" in out
    assert "past max_len" not in run(capsys, "info", "--preset", "base", "--length", "1024")[1]


def test_train_preset_big_trains_300k_steps_and_keeps_the_20_checkpoints_it_averages(tmp_path, monkeypatch, capsys):
    """Table 3's big row trains 300K steps and §6.1 averages its last 20 checkpoints; an option
    given on the command line still wins."""
    made = []
    monkeypatch.setattr("aiayn.train.train_run", lambda model, training, out, resume: made.append(training))
    assert run(capsys, "train", "--preset", "big", "--out", str(tmp_path / "big"))[0] == 0
    assert run(capsys, "train", "--preset", "big", "--out", str(tmp_path / "short"), "--max-steps", "10")[0] == 0
    assert run(capsys, "train", "--preset", "base", "--out", str(tmp_path / "base"))[0] == 0
    assert [(t.max_steps, t.keep_last) for t in made] == [(300_000, 20), (10, 20), (100_000, 5)]


def test_a_resumed_run_refuses_a_preset_of_another_model_or_training(tmp_path, monkeypatch, capsys):
    from aiayn.config import PRESETS
    from aiayn.run import RunDir

    made, trained = [], []
    monkeypatch.setattr("aiayn.train.train_run",
                        lambda model, training, out, resume: (made.append(model), trained.append(training)))
    RunDir(tmp_path).write_configs(PRESETS["tiny"], TrainConfig())
    for given in ([], ["--preset", "tiny"], ["--preset", "tiny", "--max-steps", "5"]):  # its own preset, or none
        assert run(capsys, "train", "--out", str(tmp_path), "--resume", *given)[0] == 0
    assert made == [PRESETS["tiny"]] * 3
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--preset", "big", "--out", str(tmp_path), "--resume", "--max-steps", "6"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and "a resumed run keeps its model" in err and "--preset" in err
    assert "goes on with" not in out  # (found in review: the change was announced, then refused)
    RunDir(tmp_path / "base").write_configs(PRESETS["base"], TrainConfig())
    for other in ("D1", "E"):  # the base model's shape, another dropout or other positions
        with pytest.raises(SystemExit):
            main(["train", "--preset", other, "--out", str(tmp_path / "base"), "--resume"])
        assert "a resumed run keeps its model" in capsys.readouterr().err
    # D3 is base's model trained with ε_ls = 0: a base run resumed as D3 would go on with 0.1.
    with pytest.raises(SystemExit):
        main(["train", "--preset", "D3", "--out", str(tmp_path / "base"), "--resume"])
    err = capsys.readouterr().err
    assert "--preset D3 trains with label_smoothing (--label-smoothing) 0.0, this run with 0.1" in err
    assert "give --label-smoothing 0.0 to change it" in err
    assert run(capsys, "train", "--preset", "D3", "--label-smoothing", "0.0", "--out", str(tmp_path / "base"),
               "--resume")[0] == 0  # asked for: the run's training changed, as any option given does
    assert trained[-1].label_smoothing == 0.0 and made[-1] == PRESETS["base"]
    # big's 300K steps and 20 checkpoints are how long it trains: a big run resumed once with
    # --max-steps 400000 resumes with its preset as it is.
    RunDir(tmp_path / "big").write_configs(PRESETS["big"], TrainConfig(max_steps=400_000, keep_last=5))
    assert run(capsys, "train", "--preset", "big", "--out", str(tmp_path / "big"), "--resume")[0] == 0
    assert (trained[-1].max_steps, trained[-1].keep_last) == (400_000, 5)


@pytest.mark.parametrize("argv, says", [(["translate", "run", "--precision", "fp8"], "invalid choice: 'fp8'"),
                                        (["translaet"], "invalid choice: 'translaet'"),
                                        (["train", "--max-tokens", "many"], "invalid int value: 'many'"),
                                        (["train", "--share-embeddings", "maybe"], "expected true or false, got 'maybe'"),
                                        (["train", "--out", "r", "--max-tokenz", "9"], "unrecognized arguments: --max-tokenz"),
                                        # fairseq's --lr was taken for --lr-scale, a 2,000× smaller rate
                                        (["train", "--out", "r", "--lr", "5e-4"], "unrecognized arguments: --lr 5e-4"),
                                        (["translate", "run", "--bea", "5"], "unrecognized arguments: --bea 5"),
                                        (["corpus", "export", "bible-en-es", "--out", "d", "--spilt"], "arguments: --spilt"),
                                        (["--verbose", "train", "--out", "r"], "unrecognized arguments: --verbose"),
                                        # was "invalid choice: '4'" (found by a newcomer's run of the README)
                                        (["--beam", "4", "translate", "run"], "--beam before the command (its options follow it")])
def test_a_mistake_the_parser_finds_is_one_line_too(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("aiayn: error:") and err.count("\n") == 1
    # The help that lists the options of the command given (an unknown option included).
    named = argv[:2] if argv[0] in ("translate", "train", "corpus") else []  # a mistake after the command's name
    command = " ".join(word for word in named if word in ("translate", "train", "corpus", "export"))
    assert says in err and f"(see aiayn {command} --help)".replace("  ", " ") in err


def test_out_of_memory_in_training_names_the_options_of_training(tmp_path, monkeypatch, capsys):
    def allocate(*args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr("aiayn.train.train_run", allocate)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "out of memory" in err
    assert "--max-tokens" in err and "--accumulate" in err and "--batch-tokens" not in err


def test_every_command_s_out_of_memory_advice_names_only_options_it_has():
    """Found in review: `attention`, `average`, `preprocess` and the others were told to lower
    translate's --batch-tokens, an option they do not have."""
    import argparse
    import re

    from aiayn.cli import build_parser
    from aiayn.errors import ask_for_less

    def flags(parser) -> set:
        nested = [p for a in parser._actions if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]
        return {o for a in parser._actions for o in a.option_strings}.union(*map(flags, nested))

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, parser in commands.items():
        named = set(re.findall(r"--[a-z-]*[a-z]", ask_for_less(name)))
        assert named <= flags(parser), (name, named - flags(parser))
    assert "--max-tokens" in ask_for_less("attention") and "--batch-tokens" in ask_for_less("parse")


def test_info_takes_config_overrides(capsys):
    _, out, _ = run(capsys, "info", "--preset", "base", "--vocab-size", "8000", "--positional", "learned",
                    "--share-embeddings", "false")
    assert "vocab_size         8000" in out and "positional         learned" in out
    assert "share_embeddings   False" in out
    assert "paper (Table 3)" not in out  # no longer the paper's model
    _, out, _ = run(capsys, "info", "--share-embeddings", "OFF")  # in any case
    assert "share_embeddings   False" in out


def test_info_counts_any_depth_as_the_whole_model_does_and_refuses_sizes_past_pytorchs(capsys):
    """Found in review: 100,000 layers were built one by one for minutes, and sizes past what
    PyTorch can describe were tracebacks (exit 1)."""
    from aiayn.checkpoint import meta_model, parameter_counts
    from aiayn.model import Transformer

    config = dataclasses.replace(ModelConfig(vocab_size=1000), n_layers=5)
    whole = meta_model(Transformer, config)
    assert parameter_counts(Transformer, config) == {
        "embeddings": 1000 * 512, "total": whole.num_parameters(),
        **{side: sum(p.numel() for n, p in getattr(whole, side).named_parameters() if not n.startswith("embed."))
           for side in ("encoder", "decoder")}}
    code, out, _ = run(capsys, "info", "--n-layers", "100000")
    assert code == 0 and "parameters" in out
    for flag, value in (("--d-model", "10000000000"), ("--vocab-size", str(10**20))):
        with pytest.raises(SystemExit) as exit_info:
            main(["info", flag, value])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith("aiayn: error: this model is too large to describe")
        assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "--preset", "huge"], "unknown preset 'huge'"),
        (["info", "--d-model", "100", "--n-heads", "3"], "not divisible by n_heads (--n-heads) 3; set d_k and d_v (--d-k, --d-v)"),
        (["info", "--length", "0"], "--length must be at least 1"),
        (["translate", "/nonexistent/run", "--output", "out.txt", "--resume", "--force"], "give one of them"),
        # An empty --output wrote to stdout; "." and "/" named no file (a raw PosixPath repr); "x/" wrote x.
        *[(["translate", "/nonexistent/run", "--output", out], f"--output names a file (or - for stdout), got {out!r}")
          for out in ("", ".", "/", "new.hyp/")],
        (["demo", "--minutes", "0", "--out", "/nonexistent/demo"], "--minutes must be above 0, got 0.0"),  # before any folder
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn: error:") and message in err and err.count("\n") == 1


# Run with PyTorch's import made to fail as it starts (or to be Ctrl-C'd there): what the command
# line does before PyTorch has loaded, and that a Ctrl-C while it loads is handled.
NO_TORCH = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise {error}("torch")
sys.meta_path.insert(0, Refuse())
from aiayn.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_torch(error: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH.format(error=error), *argv], capture_output=True, text=True)


def test_the_command_line_answers_help_and_mistakes_before_pytorch_loads():
    """PyTorch takes seconds to import; --help, --version and a flag's mistake need none of it."""
    for argv in (["--help"], ["translate", "--help"], ["--version"]):
        done = without_torch("ImportError", *argv)
        assert done.returncode == 0 and "aiayn" in done.stdout, done.stderr
    done = without_torch("ImportError", "info", "--length", "x")
    assert done.returncode == 2 and "invalid int value: 'x'" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_while_pytorch_loads_is_one_line():
    done = without_torch("KeyboardInterrupt", "info", "--preset", "base")
    assert (done.returncode, done.stderr) == (130, "aiayn: interrupted\n")


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`aiayn info ... | head -1`: no error for stdout's pipe closed early, as for any filter."""
    child = subprocess.Popen([sys.executable, "-m", "aiayn", "info", "--preset", "big"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    child.stdout.close()  # before the command has printed anything
    assert child.wait() == 141 and child.stderr.read() == ""


def test_demo_trains_translates_and_scores(tmp_path):
    """The README's main command, on a budget of seconds: python -m aiayn demo."""
    argv = [sys.executable, "-m", "aiayn", "demo", "--minutes", "0.05", "--preset", "tiny", "--test-sentences", "2",
            "--out", str(tmp_path / "demo")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "corpus bible-en-es" in done.stdout and "test BLEU" in done.stdout and "nrefs:1" in done.stdout
    assert "source     " in done.stdout and "reference  " in done.stdout
    assert "averaged the last" in done.stdout and (tmp_path / "demo" / "averaged" / "model.safetensors").is_file()
    figures = json.loads((tmp_path / "demo" / "demo.json").read_text())  # the README demo table's row
    assert f"test BLEU {figures['test_bleu']:.1f} ({figures['bleu_signature']}); chrF {figures['test_chrf']:.1f};" in done.stdout
    assert f"matmul peak {figures['matmul_peak_tflops']:.2f} TFLOP/s; {figures['steps']:,} steps" in done.stdout
    assert figures["test_sentences"] == 2 and figures["cpu_kind"] in done.stdout and figures["training_minutes"] > 0
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)  # reuses the run
    assert again.returncode == 0 and "resumed from" in again.stdout and "note:" not in again.stderr
    assert "goes on with the model" not in again.stdout  # the settings it began with: nothing to say
    again = subprocess.run([*argv, "--recipe", "paper"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resumed from" in again.stdout
    # not silently ignored; on stdout, in order with the demo's report, as every progress command's notes
    assert f"note: {tmp_path / 'demo'} goes on with the model, recipe, precision and seed it began with" in again.stdout
    kept = (tmp_path / "demo" / "demo.json").read_text()
    again = subprocess.run([*argv[:-3], "1", *argv[-2:]], capture_output=True, text=True, timeout=300)  # 1 test verse
    assert again.returncode == 0 and "(demo.json keeps the score on 2 verses)" in again.stdout, again.stderr[-2000:]
    assert (tmp_path / "demo" / "demo.json").read_text() == kept  # a score on fewer verses never replaces it
    assert json.loads((tmp_path / "demo" / "demo-1-verses.json").read_text())["test_sentences"] == 1


def test_corpus_export_writes_two_aligned_files(tmp_path, capsys):
    code, out, _ = run(capsys, "corpus", "export", "bible-en-es", "--split", "test", "--out", str(tmp_path))
    assert code == 0
    en = (tmp_path / "test.en").read_text(encoding="utf-8").splitlines()
    es = (tmp_path / "test.es").read_text(encoding="utf-8").splitlines()
    assert len(en) == len(es) >= 1000
    assert en[0].startswith("The first book I wrote, Theophilus") and es[0].startswith("En el primer tratado")
    assert str(tmp_path / "test.en") in out
    with pytest.raises(SystemExit):
        main(["corpus", "export", "bible-en-es", "--split", "nope", "--out", str(tmp_path)])
    assert "nope" in capsys.readouterr().err


def test_every_training_option_says_what_it_does(capsys):
    """`aiayn train --help` explains each of ModelConfig's and TrainConfig's flags, as fairseq's and
    Eole's help do."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for f in dataclasses.fields(ModelConfig) + dataclasses.fields(TrainConfig):
        assert f.metadata.get("help"), f"{f.name} has no help text"
        assert f"--{f.name.replace('_', '-')}" in shown and "".join(f.metadata["help"].split()) in shown, f.name


@pytest.mark.parametrize("command, offered", [("translate", True), ("parse", False)])
def test_only_translate_offers_paragraphs(capsys, command, offered):
    """A parser reads one tokenized sentence a line: `parse` has no --split-sentences or --lang."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr().out
    assert ("--split-sentences" in shown) == ("--lang" in shown) == offered
    other = "parse" if command == "translate" else "translate"
    assert f"aiayn {other}" not in shown and "Options" not in shown  # each described as itself
    if not offered:
        with pytest.raises(SystemExit) as stopped:
            main([command, "run", "--split-sentences"])
        assert stopped.value.code == 2 and "unrecognized arguments: --split-sentences" in capsys.readouterr().err


def test_a_recipe_trains_a_bf16_copy_only_in_one_process(tmp_path, monkeypatch, capsys):
    """Under torchrun (WORLD_SIZE > 1) --recipe fast in bf16 trains with autocast, not a bf16 copy
    (found by mutation: one process assumed passed every test)."""
    made = []
    monkeypatch.setattr("aiayn.train.train_run", lambda model, training, out, resume: made.append(training))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run(capsys, "train", "--recipe", "fast", "--precision", "bf16", "--out", str(tmp_path / "two"))[0] == 0
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert run(capsys, "train", "--recipe", "fast", "--precision", "bf16", "--out", str(tmp_path / "one"))[0] == 0
    assert [training.bf16_weights for training in made] == [False, True]


def test_a_run_begun_with_attention_biases_resumes_under_its_preset_and_one_process_says_its_notes(tmp_path, monkeypatch,
                                                                                                   capsys):
    """A run begun before the paper's bias-free attention keeps its biases under `--preset` (found
    by mutation: untested), and under torchrun the first process alone says what a resume
    changes (found by a misuse hunt: every process said it)."""
    from aiayn.config import PRESETS
    from aiayn.run import RunDir

    made = []
    monkeypatch.setattr("aiayn.train.train_run", lambda model, training, out, resume: made.append(model))
    RunDir(tmp_path).write_configs(dataclasses.replace(PRESETS["tiny"], attention_bias=True), TrainConfig())
    assert run(capsys, "train", "--out", str(tmp_path), "--resume", "--preset", "tiny")[0] == 0
    assert made[-1].attention_bias
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        code, out, _ = run(capsys, "train", "--out", str(tmp_path), "--resume", "--max-steps", "5")
        said[rank] = (code, "goes on with" in out)
    assert said == {"0": (0, True), "1": (0, False)}
