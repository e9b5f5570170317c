"""Faults and bad input, as a user meets them: nothing lost, nothing overwritten, no traceback.

Each test holds one row of the table in docs/robustness.md.
"""

import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn import decode_files, translate as translate_module
from aiayn.run import RunDir, languages_of
from aiayn.cli import main
from aiayn.config import DecodeConfig, ModelConfig
from aiayn.device import check_precision, fast_bf16
from aiayn.loss import perplexity
from aiayn.marian import export_marian
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer

SENTENCES = ["the small cat sees a big dog", "a red bird eats the blue fish", "the dog likes the cat near the river"] * 40
WORDS = "the a small big red blue cat dog bird fish sees likes eats finds near under over with".split()


def cli(capsys, *argv, stdin: bytes = None, monkeypatch=None):
    """`aiayn ARGV` in this process: (exit status, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *fragments):
    assert code == 2, err
    assert err.startswith("aiayn: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def make_model(folder: Path, **overrides) -> Path:
    """A random model with a real tokenizer in `folder`: translations are nonsense, the plumbing real."""
    tokenizer = Tokenizer.train(SENTENCES, 300, folder)
    torch.manual_seed(0)
    config = ModelConfig(**{"vocab_size": tokenizer.vocab_size, "d_model": 32, "n_heads": 4, "d_ff": 64, "n_layers": 1,
                            "dropout": 0.0, **overrides})
    Transformer(config).save(folder)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def corpus_tsv(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(300):
        n = int(torch.randint(3, 9, (1,), generator=g))
        words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g)]
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)))
    path = tmp_path_factory.mktemp("corpus") / "toy.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_argv(corpus, out, *extra):
    return ["train", "--preset", "tiny", "--vocab-size", "300", "--d-model", "32", "--d-ff", "64", "--corpus", str(corpus),
            "--out", str(out), "--max-tokens", "300", "--warmup-steps", "20", "--log-every", "1", "--eval-every", "1000",
            "--device", "cpu", "--seed", "3", *extra]


def log_steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]


def losses(run: Path) -> dict:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


# --- 1. nothing overwritten -------------------------------------------------------------------

def test_import_hf_never_replaces_a_folder_without_force_and_then_replaces_it_whole(tmp_path, model_dir, capsys):
    export_marian(model_dir, tmp_path / "hf", echo=lambda _: None)
    run = tmp_path / "run"
    assert cli(capsys, "import-hf", tmp_path / "hf", run)[0] == 0
    (run / "model" / "tokenizer.model").write_bytes(b"a leftover tokenizer")
    (run / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", run)
    one_line_error(code, err, "already exists; pass --force to replace it")  # the API's force=True is the API's to say
    assert (run / "notes.txt").read_text() == "mine"
    assert cli(capsys, "import-hf", tmp_path / "hf", run, "--force")[0] == 0
    assert sorted(p.name for p in run.iterdir()) == ["model"]  # replaced whole: nothing old is left
    assert not (run / "model" / "tokenizer.model").exists()
    one_line_error(*cli(capsys, "export-hf", run, tmp_path / "hf")[::2], "already exists")


def test_train_refuses_an_imported_run_with_or_without_resume(tmp_path, model_dir, corpus_tsv, capsys):
    export_marian(model_dir, tmp_path / "hf", echo=lambda _: None)
    run = tmp_path / "run"
    assert cli(capsys, "import-hf", tmp_path / "hf", run)[0] == 0
    weights = (run / "model" / "model.safetensors").read_bytes()
    for resume in ((), ("--resume",)):  # without it, "pass --resume" led only to the second refusal
        one_line_error(*cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "1", *resume))[::2],
                       "no checkpoint to resume (an imported model?)", f"--init-from {run} and another --out")
    assert (run / "model" / "model.safetensors").read_bytes() == weights


def test_force_never_replaces_the_current_folder_a_folder_above_it_or_a_run(tmp_path, model_dir, capsys, monkeypatch):
    """Found in a newcomer's review: `--out . --force` deleted every file of the shell's folder
    (or failed with a raw EBUSY, leaving a hidden folder), and `attention --out RUN --force`
    replaced a training run with nine PNGs."""
    from aiayn.config import PRESETS, TrainConfig

    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work / "sub")
    attention = ["attention", model_dir, "--sentence", "the cat", "--beam", "1", "--force", "--out"]
    for out, says in ((".", "is the current folder"), ("..", "holds the current one"), (work, "holds the current one")):
        one_line_error(*cli(capsys, *attention, out)[::2], says, "choose another output")
    run = tmp_path / "run"
    RunDir(run).write_configs(PRESETS["tiny"], TrainConfig())
    with RunDir(run).lock():
        pass  # a run keeps its lock file
    one_line_error(*cli(capsys, *attention, run)[::2], "is a training run or an experiment", "never a run")
    assert (work / "notes.txt").read_text() == "mine" and RunDir(run).has_configs() and not list(work.glob(".*"))
    # A run one level down is deleted with its folder as surely (found in review: export-ct2, average
    # and preprocess --force into the folder above a run deleted it, exit 0)
    outer = tmp_path / "outer"
    shutil.copytree(run, outer / "run")
    one_line_error(*cli(capsys, *attention, outer)[::2], f"holds a training run or an experiment, {outer / 'run'}",
                   "never a run")
    assert RunDir(outer / "run").has_configs()


def test_a_new_run_refuses_a_folder_of_the_users_files_it_would_replace(tmp_path, corpus_tsv, capsys):
    """Found in review: `train --out FOLDER` over a folder of the user's replaced its loss.png,
    configs and tokenizer.model, saying "replacing the tokenizer ..., left by an earlier start".
    What an earlier start left (its lock is there) is still taken over without --resume."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("loss.png", "tokenizer.model"):
        (mine / name).write_text("theirs")
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, mine, "--max-steps", "1"))[::2],
                   "holds loss.png, tokenizer.model, which a new run there would replace", "choose another --out")
    assert all((mine / name).read_text() == "theirs" for name in ("loss.png", "tokenizer.model"))
    assert sorted(path.name for path in mine.iterdir()) == ["loss.png", "tokenizer.model"]
    one_line_error(*cli(capsys, "demo", "--out", mine, "--minutes", "0.05")[::2],  # (its outer lock hid them: found in review)
                   "holds loss.png, tokenizer.model, which a new run there would replace")
    assert sorted(path.name for path in mine.iterdir()) == ["loss.png", "tokenizer.model"]
    started = tmp_path / "started"  # a start that failed after writing its tokenizer
    with RunDir(started).lock():
        (started / "tokenizer.model").write_text("an earlier start's")
    assert cli(capsys, *train_argv(corpus_tsv, started, "--max-steps", "1"))[0] == 0
    assert (started / "model" / "model.safetensors").exists()


def test_a_resume_without_the_runs_tokenizer_takes_its_checkpoints(tmp_path, corpus_tsv, capsys):
    """Found in review: with RUN/tokenizer.model (and RUN/data) removed, --resume trained a new
    tokenizer on the corpus, or took another data folder's, and went on training the checkpoints'
    ids as the new tokenizer's words; each checkpoint holds the one it was trained with."""
    from aiayn.store import tokenizer_digest

    run, other = tmp_path / "run", tmp_path / "other"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))[0] == 0
    trained = tokenizer_digest(RunDir(run).checkpoints()[-1])
    lines = corpus_tsv.read_text(encoding="utf-8").splitlines()
    (tmp_path / "more.tsv").write_text("\n".join(lines + [f"{line} x" for line in lines[:100]]) + "\n", encoding="utf-8")
    assert cli(capsys, "preprocess", "--corpus", tmp_path / "more.tsv", "--out", other, "--vocab-size", "300")[0] == 0
    assert tokenizer_digest(other) != trained
    (run / "tokenizer.model").unlink()
    argv = train_argv(corpus_tsv, run, "--max-steps", "3", "--resume")
    argv[argv.index("--corpus"):argv.index("--corpus") + 2] = ["--data", str(other)]
    one_line_error(*cli(capsys, *argv)[::2], "was encoded with another tokenizer than the one this run was trained with",
                   "step_00000002")
    shutil.rmtree(run / "data")
    code, out, err = cli(capsys, *train_argv(tmp_path / "more.tsv", run, "--max-steps", "3", "--resume"))
    assert code == 0, err
    assert "SentencePiece" not in out + err and tokenizer_digest(run) == trained == tokenizer_digest(run / "model")


def test_resume_and_demo_refuse_a_folder_that_is_not_their_run(tmp_path, corpus_tsv, capsys):
    """A mistyped --resume folder started a new run from scratch, and `demo --out` on a run of
    another corpus trained on, then ended in `no sentences to score`."""
    from aiayn.config import PRESETS, TrainConfig

    typo = tmp_path / "typo"
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, typo, "--max-steps", "1", "--resume"))[::2],
                   "holds no run to resume", "leave out --resume")
    assert not typo.exists()
    other = tmp_path / "other"
    RunDir(other).write_configs(PRESETS["tiny"], TrainConfig(corpus=str(corpus_tsv)))
    one_line_error(*cli(capsys, "demo", "--out", other, "--minutes", "0.05")[::2],
                   f"is a run on {corpus_tsv}, not the demo's bible-en-es")
    assert not (other / "checkpoints").exists() and not (other / "averaged").exists()
    mine = tmp_path / "mine"  # a folder of the user's, no run: the demo's outputs would replace theirs
    (mine / "attention").mkdir(parents=True)
    (mine / "attention" / "notes.txt").write_text("mine")
    one_line_error(*cli(capsys, "demo", "--out", mine, "--minutes", "0.05")[::2],
                   "mine holds attention, which a new demo run there would replace; choose another --out")
    assert (mine / "attention" / "notes.txt").read_text() == "mine" and not (mine / "checkpoints").exists()


def test_average_writes_its_folder_whole_and_never_over_another(tmp_path, corpus_tsv, capsys, monkeypatch):
    run = tmp_path / "run"
    code, out, _ = cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))
    assert code == 0 and "note: no dev pairs (no dev split, or none within --max-sentence-tokens): training runs without validation" in out  # a TSV: train only
    (tmp_path / "avg").mkdir()
    (tmp_path / "avg" / "mine.txt").write_text("mine")
    one_line_error(*cli(capsys, "average", run, "--last", "2", "--out", tmp_path / "avg")[::2], "already exists")
    assert cli(capsys, "average", run, "--last", "2", "--out", tmp_path / "avg", "--force")[0] == 0
    assert sorted(p.name for p in (tmp_path / "avg").iterdir()) == ["config.json", "model.safetensors", "tokenizer.model"]
    # --steps: the checkpoints of given steps (fairseq's --inputs), each once, oldest first
    code, out, _ = cli(capsys, "average", run, "--steps", "2", "1", "2", "--out", tmp_path / "by-steps")
    assert code == 0 and "averaged step_00000001, step_00000002 into" in out
    assert (tmp_path / "by-steps" / "model.safetensors").read_bytes() == (tmp_path / "avg" / "model.safetensors").read_bytes()
    code, out, err = cli(capsys, "average", run, "--last", "9", "--out", tmp_path / "all")
    assert code == 0 and f"aiayn: note: {run} keeps 2 checkpoints; averaging those\n" in err and "note" not in out
    one_line_error(*cli(capsys, "average", run, "--steps", "1", "7", "--out", tmp_path / "avg7")[::2],
                   "has no checkpoint step_00000007; it keeps those of steps 1, 2")
    one_line_error(*cli(capsys, "average", run, "--steps", "1", "--last", "2", "--out", tmp_path / "avg7")[::2],
                   "give --last (the last checkpoints) or --steps (those of given steps), not both")
    assert not (tmp_path / "avg7").exists()
    # A checkpoint without its tokenizer: the run folder's goes with the model (found in review: none did)
    (run / "checkpoints" / "step_00000002" / "tokenizer.model").unlink()
    assert cli(capsys, "average", run, "--last", "2", "--out", tmp_path / "avg9")[0] == 0
    assert (tmp_path / "avg9" / "tokenizer.model").read_bytes() == (run / "tokenizer.model").read_bytes()
    import aiayn.run  # a run training beside deletes a checkpoint as it is read

    real = aiayn.run.average_checkpoints
    monkeypatch.setattr(aiayn.run, "average_checkpoints",
                        lambda chosen, *rest, **options: (shutil.rmtree(chosen[0]), real(chosen, *rest, **options)))
    one_line_error(*cli(capsys, "average", run, "--last", "2", "--out", tmp_path / "avg8")[::2],
                   "step_00000001 went away while being read: a run training in", "average again, or once it stops")


def test_averaging_never_spoils_a_run_nor_averages_what_does_not_belong_together(tmp_path, corpus_tsv, model_dir, capsys):
    """Found by a misuse hunt: an output three folders down in a run (RUN/checkpoints/step_N/FILE)
    was written over even a checkpoint's weights; the Python API's force=True replaced the
    checkpoint it read and the run's model/; a checkpoint of another run (same sizes, another
    tokenizer) and one holding NaN were averaged, exit 0; Transformer.load(..., "cuda") without a
    GPU said "pin_memory"; a run's checkpoints/ given as a model pointed at the oldest."""
    from aiayn.run import average_checkpoints

    run = tmp_path / "run"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))[0] == 0
    first, newest = RunDir(run).checkpoints()
    weights = (newest / "model.safetensors").read_bytes()
    one_line_error(*cli(capsys, "average", run, "--last", "1", "--out", first / "avg", "--force")[::2],
                   "which a training run keeps")
    (tmp_path / "in.txt").write_text("the cat\n")
    one_line_error(*cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output",
                        newest / "model.safetensors", "--force")[::2], "which a training run keeps")
    code, _, err = cli(capsys, "average", run, "--last", "9", "--out", run / "model", "--force")
    one_line_error(code, err, "a training run keeps")  # before the output's lock, and before any note
    for out in (newest, run / "model", first):
        with pytest.raises(ValueError):
            average_checkpoints([first, newest], out, force=True)
    assert (newest / "model.safetensors").read_bytes() == weights and (newest / "trainer.json").is_file()
    average_checkpoints([first, newest], RunDir(run).averaged, force=True)  # the run's averaged model is made anew
    other = tmp_path / "other"
    shutil.copytree(newest, other)
    (other / "tokenizer.model").write_bytes(b"another" + (other / "tokenizer.model").read_bytes())
    with pytest.raises(ValueError, match="has another tokenizer than"):
        average_checkpoints([other, newest], tmp_path / "mixed")
    model = Transformer.load(newest)
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    model.save(other, force=True)
    (other / "tokenizer.model").write_bytes((newest / "tokenizer.model").read_bytes())
    with pytest.raises(ValueError, match="holds values that are not finite"):
        average_checkpoints([other, newest], tmp_path / "nan")
    assert not (tmp_path / "mixed").exists() and not (tmp_path / "nan").exists()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
            Transformer.load(newest, "cuda")
    with pytest.raises(FileNotFoundError, match=f"it holds one, {newest}"):
        Transformer.load(run / "checkpoints")


def test_a_run_that_diverges_stops_before_saving_anything_of_it(tmp_path, corpus_tsv, capsys):
    """At --lr-scale 1e30 Adam moves a weight by about the rate times m̂/√v̂ (of order 1), over
    1e26 at step 4 here, so step 5's forward overflows fp32 (a product of two such weights is
    past 3.4e38): its loss is no longer finite. The run stops in one line; the checkpoint whose
    weights gave that loss is moved aside, and the model and checkpoints of before are as they
    were (a NaN checkpoint rotated them out, and the run ended "done", exit 0)."""
    run = tmp_path / "run"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "3", "--save-every", "1", "--keep-last", "2"))[0] == 0
    before = tree_of(run)
    code, _, err = cli(capsys, *train_argv(corpus_tsv, run, "--resume", "--max-steps", "9", "--save-every", "1",
                                           "--lr-scale", "1e30"))
    one_line_error(code, err, "training diverged at step 5: its loss is", "(from the weights of step_00000004, now "
                   "diverged-step_00000004); nothing of it was saved (the newest checkpoint is step_00000003): --resume "
                   "with a smaller --lr-scale")
    after = tree_of(run)
    for kept in ("model/", "checkpoints/step_00000003/"):  # the first session's model and its newest checkpoint
        assert {p: b for p, b in after.items() if p.startswith(kept)} == {p: b for p, b in before.items() if p.startswith(kept)}
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["diverged-step_00000004", "step_00000003"]
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "inf", "--lr-scale", "inf"))[::2],
                   "lr_scale (--lr-scale) must be positive and finite, got inf")


def test_a_resumed_run_says_what_it_changes_and_keeps_what_it_began_with(tmp_path, model_dir, corpus_tsv, capsys,
                                                                         monkeypatch):
    """Found in review: a fine-tuned run could not resume once the model it began from had moved,
    nor from another folder (its paths were recorded as given, relative); a resume with another
    --corpus or --init-from recorded what it did not use; changed settings applied without a word."""
    shutil.copytree(model_dir, tmp_path / "start")
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "train", "--init-from", "start", "--corpus", corpus_tsv, "--out", "run", "--max-steps", "1",
               "--max-tokens", "300", "--device", "cpu", "--log-every", "1", "--eval-every", "1000")[0] == 0
    recorded = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert recorded["init_from"] == str(tmp_path / "start")
    (tmp_path / "start").rename(tmp_path / "moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    shutil.copy(corpus_tsv, tmp_path / "other.tsv")
    code, out, err = cli(capsys, "train", "--out", tmp_path / "run", "--resume", "--max-steps", "2", "--lr-scale", "0.5",
                         "--corpus", tmp_path / "other.tsv", "--init-from", tmp_path / "moved", "--recipe", "fast")
    assert code == 0, err
    for note in ("note: --init-from is not applied", "note: --corpus is not applied", "note: --recipe sets up a new run",
                 "goes on with --lr-scale 1.0 → 0.5, --max-steps 1 → 2"):
        assert note in out, out
    assert "batched anew" not in out
    code, out, err = cli(capsys, "train", "--out", tmp_path / "run", "--resume", "--max-steps", "3", "--max-tokens", "200")
    assert code == 0 and "--max-tokens 300 → 200" in out and "the rest of this epoch is batched anew" in out, err
    one_line_error(*cli(capsys, "train", "--init-from", tmp_path / "moved", "--corpus", corpus_tsv, "--out", "new",
                        "--d-model", "128")[::2], "holds another model shape than --d-model asks for")
    for asked, said in ((("--preset", "tiny"), "than --preset tiny asks for"), (("--recipe", "fast"), "than the recipe asks for")):
        one_line_error(*cli(capsys, "train", "--init-from", tmp_path / "moved", "--corpus", corpus_tsv, "--out", "new",
                            *asked)[::2], said)  # found in review: trained the starting model without a word
    assert not (tmp_path / "elsewhere" / "new").exists()  # it left a folder with a lock and a tokenizer
    after = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert (after["init_from"], after["corpus"], after["lr_scale"]) == (recorded["init_from"], recorded["corpus"], 0.5)
    assert log_steps(tmp_path / "run")[-1] == 3


def test_a_new_run_never_replaces_data_it_did_not_make(tmp_path, model_dir, corpus_tsv, capsys):
    """Found in review: a new run's preprocessing rebuilt OUT/data with force, deleting a user's
    files there (the corpus itself, given as --corpus OUT/data), and `demo --out` an experiment's
    shared data; `--out ""` was the current folder; a --sentence of undecodable bytes a traceback."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "mine.txt").write_text("mine")
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, project, "--max-steps", "1"))[::2],
                   "project/data holds files aiayn did not make (no manifest.json)", "choose another --out")
    (tmp_path / "t3" / "data").mkdir(parents=True)
    (tmp_path / "t3" / "experiment.json").write_text("{}")
    one_line_error(*cli(capsys, "demo", "--out", tmp_path / "t3", "--minutes", "0.05")[::2],
                   "holds a Table 3 experiment (experiment.json); choose another --out")
    assert sorted(p.name for p in (project / "data").iterdir()) == ["mine.txt"]
    # A refused start leaves no lock of its own: a folder holding one passes for a run's (RunDir.lock)
    assert sorted(p.name for p in (tmp_path / "t3").iterdir()) == ["data", "experiment.json"]
    for argv in (["demo", "--out", ""], ["experiment", "table3", "--out", ""], train_argv(corpus_tsv, "")):
        one_line_error(*cli(capsys, *argv)[::2], "--out is empty")
    one_line_error(*cli(capsys, "attention", model_dir, "--sentence", "caf\udce9 latte", "--out", tmp_path / "maps")[::2],
                   "--sentence is not valid UTF-8")
    one_line_error(*cli(capsys, "attention", model_dir, "--sentence", "\u200b\u2060", "--out", tmp_path / "maps")[::2],
                   "--sentence is empty but for invisible characters")  # (found in review: translated, maps drawn)
    assert not (tmp_path / "maps").exists()


def test_perplexity_is_inf_past_what_a_float_holds():
    assert perplexity(0.0) == 1.0 and perplexity(math.log(20.0)) == pytest.approx(20.0)
    assert perplexity(710.0) == perplexity(1e300) == math.inf  # math.exp(710.0) is an OverflowError


def test_a_folder_output_stopped_between_its_renames_keeps_the_old_one(tmp_path, monkeypatch):
    """--force moves the old output aside, then renames the new one in: stopped between the two,
    the old one comes back (it was left hidden, and OUT gone; found in review)."""
    import aiayn.files

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real, renames = os.replace, []

    def stopped_on_the_second(source, target):
        renames.append(target)
        if len(renames) == 2:
            raise KeyboardInterrupt
        real(source, target)

    monkeypatch.setattr(aiayn.files.os, "replace", stopped_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        aiayn.files.atomic_dir(out, lambda tmp: (tmp / "new.txt").write_text("new"), force=True)
    monkeypatch.setattr(aiayn.files.os, "replace", real)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    assert [path.name for path in out.iterdir()] == ["old.txt"]


def test_a_folder_output_killed_between_its_renames_is_put_back_by_the_next_writer(tmp_path):
    """SIGKILL between the renames runs no handler: the old output is left only in its hidden
    `.NAME.XXXXXXXX.old.tmp`. The next writer puts it back (found in review: it deleted it as
    an unfinished leftover), refuses to replace it without force, and replaces it with force."""
    import aiayn.files

    out = tmp_path / "out"
    aside = tmp_path / ".out.abcd1234.old.tmp"
    (aside / "out").mkdir(parents=True)
    (aside / "out" / "old.txt").write_text("old")
    (tmp_path / ".out.wxyz5678.tmp").mkdir()  # the new one, half built
    with pytest.raises(FileExistsError, match="--force"):
        aiayn.files.atomic_dir(out, lambda tmp: (tmp / "new.txt").write_text("new"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    assert (out / "old.txt").read_text() == "old"

    def too_large(tmp):
        raise OSError(27, "File too large")  # as `ulimit -f` makes a write fail, naming no file

    with pytest.raises(OSError, match=f"cannot write {out}: .*File too large"):
        aiayn.files.atomic_dir(out, too_large, force=True)
    with pytest.raises(OSError):  # the folders made for a new output go again with it (found in review: left empty)
        aiayn.files.atomic_dir(tmp_path / "new" / "deeper" / "out", too_large)
    assert not (tmp_path / "new").exists()
    aiayn.files.atomic_dir(out, lambda tmp: (tmp / "new.txt").write_text("new"), force=True)
    assert [path.name for path in out.iterdir()] == ["new.txt"]


def test_a_folder_output_replaced_leaves_nothing_beside_it_and_one_made_meanwhile_is_not_replaced(tmp_path):
    """With --force the old folder goes once the new one is in place (found by mutation: every
    --force left its old copy in a hidden folder beside, passing every test); an output that a
    writer taking no lock made while the build ran is refused, not moved aside and deleted (found
    by mutation: the check after the build removed passed every test)."""
    import aiayn.files

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    aiayn.files.atomic_dir(out, lambda tmp: (tmp / "new.txt").write_text("new"), force=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"] and [p.name for p in out.iterdir()] == ["new.txt"]

    def build(tmp):
        (tmp / "new.txt").write_text("new")
        (tmp_path / "theirs").mkdir()
        (tmp_path / "theirs" / "theirs.txt").write_text("theirs")

    with pytest.raises(FileExistsError, match="theirs already exists; pass --force"):
        aiayn.files.atomic_dir(tmp_path / "theirs", build)
    assert [path.name for path in (tmp_path / "theirs").iterdir()] == ["theirs.txt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "theirs"]


def test_atomic_write_syncs_before_it_renames_and_a_failed_one_names_its_file_and_leaves_nothing(tmp_path, monkeypatch):
    """The data reach the disk before the name does: renamed first, a power cut could leave the
    name over an empty or cut file (found by mutation: the order swapped, and the error left
    unnamed, each passed every test)."""
    import aiayn.files

    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(aiayn.files.os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(aiayn.files.os, "replace", lambda a, b: (events.append("replace"), replace(a, b))[1])
    aiayn.files.atomic_write(tmp_path / "x", lambda tmp: Path(tmp).write_text("x"))
    assert events == ["fsync", "replace"] and (tmp_path / "x").read_text() == "x"

    def full(tmp):
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'y'}: .*No space left"):
        aiayn.files.atomic_write(tmp_path / "y", full)
    assert [path.name for path in tmp_path.iterdir()] == ["x"]


def test_checkpoints_are_folders_ordered_by_step_and_a_pruned_one_that_cannot_move_leaves_no_litter(tmp_path,
                                                                                                   monkeypatch):
    """Past eight digits names sort otherwise than steps; a file named like a checkpoint is none;
    a checkpoint that cannot be moved aside (another file system) stays as it was, with no hidden
    folder beside it (found by mutation: each passed every test)."""
    import aiayn.files

    run = RunDir(tmp_path / "run")
    for step in (100_000_000, 99_999_999, 9):
        run.checkpoint(step).mkdir(parents=True)
    (run.path / "checkpoints" / "step_00000010").write_text("not a folder")
    assert [path.name for path in run.checkpoints()] == ["step_00000009", "step_99999999", "step_100000000"]

    def cross_device(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(aiayn.files.os, "replace", cross_device)
    with pytest.raises(OSError):
        aiayn.files.discard_dir(run.checkpoint(9))
    monkeypatch.undo()
    assert sorted(path.name for path in (run.path / "checkpoints").iterdir()) == \
        ["step_00000009", "step_00000010", "step_100000000", "step_99999999"]


def test_a_checkpoint_saved_again_is_replaced_whole_and_an_average_takes_the_newest_tokenizer(tiny_run, tmp_path):
    """A checkpoint of a step already saved is replaced, none of its old files kept (found by
    mutation: refusing it passed every test); an averaged model takes the newest checkpoint's
    tokenizer, as its docstring says, not the run folder's (found by mutation)."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.run import average_checkpoints

    shutil.copytree(tiny_run, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    newest = run.checkpoints()[-1]
    (run.path / "tokenizer.model").write_bytes(b"another tokenizer")
    average_checkpoints(run.checkpoints(), tmp_path / "averaged")
    assert (tmp_path / "averaged" / "tokenizer.model").read_bytes() == (newest / "tokenizer.model").read_bytes()
    model = Transformer.load(newest)
    optimizer = torch.optim.Adam(model.parameters())
    state = load_checkpoint(newest, model, optimizer)
    (newest / "stale.txt").write_text("x")
    run.save_checkpoint(int(newest.name.split("_")[1]), model, optimizer, state)
    assert not (newest / "stale.txt").exists() and (newest / "model.safetensors").is_file()


def test_an_interrupted_corpus_export_leaves_the_old_pair_or_none(tmp_path, capsys, monkeypatch):
    """Stopped while writing the reference side: with --force the old pair stays whole (a new
    source beside an old reference was a silently mismatched pair), without it nothing is left."""
    import aiayn.corpora

    real, writes = aiayn.corpora.atomic_write, []

    def stopped_on_the_second(path, write):
        writes.append(path)
        if len(writes) == 2:
            raise KeyboardInterrupt
        real(path, write)

    out = tmp_path / "out"
    out.mkdir()
    (out / "test.en").write_text("old en\n")
    (out / "test.es").write_text("old es\n")
    monkeypatch.setattr(aiayn.corpora, "atomic_write", stopped_on_the_second)
    argv = ["corpus", "export", "bible-en-es", "--split", "test", "--out"]
    assert cli(capsys, *argv, out, "--force")[0] == 130
    assert sorted(p.name for p in out.iterdir()) == ["test.en", "test.es"]
    assert ((out / "test.en").read_text(), (out / "test.es").read_text()) == ("old en\n", "old es\n")
    writes.clear()
    assert cli(capsys, *argv, tmp_path / "new")[0] == 130
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    monkeypatch.setattr(aiayn.corpora, "atomic_write", real)
    assert cli(capsys, *argv, tmp_path / "new")[0] == 0  # no half pair to refuse
    assert len((tmp_path / "new" / "test.en").read_text().splitlines()) == len((tmp_path / "new" / "test.es").read_text().splitlines())


def test_corpus_export_and_attention_maps_never_replace_files_without_force(tmp_path, model_dir, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "test.en").write_text("mine\n")
    argv = ["corpus", "export", "bible-en-es", "--split", "test", "--out", tmp_path / "out"]
    one_line_error(*cli(capsys, *argv)[::2], "test.en already exists", "--force")
    assert (tmp_path / "out" / "test.en").read_text() == "mine\n" and not (tmp_path / "out" / "test.es").exists()
    assert cli(capsys, *argv, "--force")[0] == 0 and (tmp_path / "out" / "test.en").read_text() != "mine\n"
    argv = ["attention", model_dir, "--sentence", "the cat", "--beam", "1", "--out", tmp_path / "maps"]
    long = ["attention", model_dir, "--sentence", " ".join(SENTENCES[:40]), "--out", tmp_path / "long"]
    one_line_error(*cli(capsys, *long)[::2], "over --max-tokens 100", "shorter sentence")
    assert not (tmp_path / "long").exists()
    for suffix in (".png", ".jpg", ".jpeg", ".svg", ".svgz", ".pdf", ".eps", ".ps", ".tif", ".tiff", ".webp", ".gif", ".bmp"):
        one_line_error(*cli(capsys, *argv[:-1], tmp_path / f"maps{suffix}")[::2], f"name a folder, not maps{suffix}")
        assert not (tmp_path / f"maps{suffix}").exists()  # (found by a misuse hunt: a folder maps.gif of figures)
    assert cli(capsys, *argv)[0] == 0
    one_line_error(*cli(capsys, *argv)[::2], "already exists", "--force")
    assert cli(capsys, *argv, "--force")[0] == 0


def test_translate_writes_no_file_through_a_symbolic_link_nor_replaces_one_without_force(tmp_path, model_dir, capsys):
    """Found in review: a link at OUT.partial had the file it names truncated and filled with the
    translation, --force or not; a link to nothing at OUT was replaced without --force."""
    source = tmp_path / "in.txt"
    source.write_text("the cat\n")
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    (tmp_path / "out.txt.partial").symlink_to(precious)
    argv = ["translate", model_dir, "--input", source, "--beam", "1", "--output"]
    one_line_error(*cli(capsys, *argv, tmp_path / "out.txt", "--force")[::2], "out.txt.partial is a symbolic link",
                   "remove the link")
    assert precious.read_text() == "precious\n" and not (tmp_path / "out.txt").exists()
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    one_line_error(*cli(capsys, *argv, tmp_path / "dangling.txt")[::2], "a symbolic link to", "pass --force")
    assert (tmp_path / "dangling.txt").is_symlink()
    assert cli(capsys, *argv, tmp_path / "dangling.txt", "--force")[0] == 0
    assert not (tmp_path / "dangling.txt").is_symlink() and not (tmp_path / "nowhere.txt").exists()


def tree_of(folder: Path) -> dict:
    """Every file under `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_force_never_puts_a_folder_where_a_file_is_nor_a_file_where_a_folder_is(tmp_path, model_dir, capsys):
    """A mistyped output path is refused in one line, --force or not: a folder output (weights,
    maps) never deletes a data file to stand in its place, nor a file output a folder."""
    data = tmp_path / "test.en"
    data.write_text("mine\n")
    for argv in (["export-ct2", model_dir, data], ["export-hf", model_dir, data],
                 ["attention", model_dir, "--sentence", "the cat", "--out", data]):
        one_line_error(*cli(capsys, *argv, "--force")[::2], "is a file, and this output is a folder")
    folder = tmp_path / "kept"
    (folder / "inside").mkdir(parents=True)
    one_line_error(*cli(capsys, "export-argos", model_dir, folder, "--source-lang", "en", "--target-lang", "es",
                        "--force")[::2], "is a folder, and this output is a file")
    assert data.read_text() == "mine\n" and (folder / "inside").is_dir()
    # found in review: OUT/ (a folder meant) wrote a package file named OUT; OUT "" was called --out
    one_line_error(*cli(capsys, "export-argos", model_dir, f"{tmp_path / 'pkg'}/", "--source-lang", "en", "--target-lang",
                        "es")[::2], "pkg/ ends in /, a folder's name; the package is one file")
    assert not (tmp_path / "pkg").exists()
    one_line_error(*cli(capsys, "export-ct2", model_dir, "")[::2], "OUT is empty: name the folder or file to write")
    # found in review: a folder of the user's own was named only, not what --force would delete with it
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (folder / name).write_text("mine\n")
    one_line_error(*cli(capsys, "export-ct2", model_dir, folder)[::2],
                   "already exists; pass --force to replace it whole, with all it holds: a.txt, b.txt, c.txt and 2 more")


def test_a_path_one_level_off_is_pointed_at_the_folder_to_give(tiny_run, tmp_path, capsys):
    """Found in review: RUN/checkpoints and MODEL/model.safetensors were "neither a model folder
    nor a run folder with a model or checkpoints", as any folder."""
    one_line_error(*cli(capsys, "translate", tiny_run / "checkpoints")[::2],
                   f"holds a run's checkpoints: give the run, {tiny_run}, or one of them, e.g. "
                   f"{tiny_run / 'checkpoints' / 'step_00000012'}")
    one_line_error(*cli(capsys, "translate", tiny_run / "averaged" / "model.safetensors")[::2],
                   f"is a file, not a model or run folder: give the model folder that holds it, {tiny_run / 'averaged'}")
    one_line_error(*cli(capsys, "translate", tiny_run / "log.jsonl")[::2], "log.jsonl is a file, not a model or run folder\n")
    # average likewise (found in review: a file was "no such run folder", an experiment "no checkpoints")
    one_line_error(*cli(capsys, "average", tiny_run / "log.jsonl", "--out", tmp_path / "avg")[::2],
                   "log.jsonl is a file, not a run folder")
    one_line_error(*cli(capsys, "average", tiny_run / "checkpoints", "--out", tmp_path / "avg")[::2],
                   f"is a run's checkpoints folder: give the run folder, {tiny_run}")
    (tmp_path / "table3").mkdir()
    (tmp_path / "table3" / "experiment.json").write_text("{}")
    one_line_error(*cli(capsys, "average", tmp_path / "table3", "--out", tmp_path / "avg")[::2],
                   f"is a Table 3 experiment: give one of its rows, e.g. {tmp_path / 'table3' / 'base'}")


def test_a_name_too_long_for_the_files_beside_it_is_refused_before_the_work(tmp_path, model_dir, tiny_run, capsys):
    """Found in review: --output of a legal 250-byte name failed on NAME.partial once the model
    had loaded; average --out of 300 bytes said "cannot write in FOLDER", which can be written."""
    (tmp_path / "in.txt").write_text("the cat\n")
    longest = "z" * (255 - len(".partial.json") - 14)  # the record's temporary file: 255 bytes
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output", tmp_path / longest)
    assert code == 0 and (tmp_path / longest).read_text().count("\n") == 1, err
    one_line_error(*cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output",
                        tmp_path / (longest + "z"))[::2], "zzz.partial.json is 242 bytes: this file system allows 255")
    one_line_error(*cli(capsys, "average", tiny_run, "--out", tmp_path / ("y" * 300))[::2],
                   "a name in this path is longer than the file system allows")


def test_an_argos_package_of_one_language_is_refused(tmp_path, model_dir, capsys):
    """LibreTranslate lists a package by its two codes: en → en is no pair (a slip of a flag)."""
    one_line_error(*cli(capsys, "export-argos", model_dir, tmp_path / "en_en.argosmodel", "--source-lang", "en",
                        "--target-lang", "en")[::2], "source and target language are both 'en'")
    assert not (tmp_path / "en_en.argosmodel").exists()
    # found in review: a recorded "english" (not checked where a run records it) was written as the
    # package's code, and "../leak" from Python wrote its folder outside; a failed export left its folders
    from aiayn.ct2 import export_argos

    with pytest.raises(ValueError, match="'../leak' is no language code"):
        export_argos(model_dir, tmp_path / "new" / "p.argosmodel", source_lang="../leak", target_lang="es")
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_force_never_replaces_an_input(tmp_path, model_dir, corpus_tsv, capsys):
    """An output that is an input, holds one or lies inside one is refused in one line, with
    --force as without, and every input is left as it was."""
    run = tmp_path / "run"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))[0] == 0
    before = tree_of(run)
    newest = sorted((run / "checkpoints").iterdir())[-1]
    for out, says in [(run, "holds"), (tmp_path, "holds"), (newest, "is an input"), (newest / "x", "lies inside")]:
        one_line_error(*cli(capsys, "average", run, "--last", "2", "--out", out, "--force")[::2], says, "choose another output")
    assert cli(capsys, "average", run, "--last", "2", "--out", run / "averaged")[0] == 0  # the README's own example
    one_line_error(*cli(capsys, "average", run / "checkpoints", "--out", tmp_path / "avg")[::2],
                   "is a run's checkpoints folder", f"give the run folder, {run}")
    one_line_error(*cli(capsys, "import-hf", tmp_path / "nope", tmp_path / "imported")[::2], "no such folder")
    shutil.rmtree(run / "averaged")
    one_line_error(*cli(capsys, "export-hf", run, run, "--force")[::2], "holds")
    assert tree_of(run) == before
    model = shutil.copytree(model_dir, tmp_path / "wrap" / "model")  # a copy: a failing test deletes only its own
    one_line_error(*cli(capsys, "export-hf", model, model / ".." / "model", "--force")[::2], "is an input")
    one_line_error(*cli(capsys, "attention", model, "--sentence", "the cat", "--out", model.parent, "--force")[::2], "holds")
    assert tree_of(model) == tree_of(model_dir)
    export_marian(model_dir, tmp_path / "hf", echo=lambda _: None)
    hf = tree_of(tmp_path / "hf")
    one_line_error(*cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "hf", "--force")[::2], "is an input")
    (tmp_path / "link").symlink_to(tmp_path / "hf")
    one_line_error(*cli(capsys, "import-hf", tmp_path / "hf", tmp_path / "link", "--force")[::2], "is an input")
    assert tree_of(tmp_path / "hf") == hf
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.tsv").write_bytes(corpus_tsv.read_bytes())
    one_line_error(*cli(capsys, "preprocess", "--corpus", corpus, "--out", corpus, "--force")[::2], "is an input")
    one_line_error(*cli(capsys, "preprocess", "--corpus", corpus, "--out", corpus / "data", "--force")[::2], "lies inside")
    assert [p.name for p in corpus.iterdir()] == ["train.tsv"]
    text = tmp_path / "in.txt"
    text.write_text("the cat\n")
    one_line_error(*cli(capsys, "translate", model_dir, "--input", text, "--output", text, "--force")[::2], "is an input")
    assert text.read_text() == "the cat\n"


def hold_lock(path: Path, lock: str = "run") -> subprocess.Popen:
    """Another process that holds the writer lock of `path` (a run folder's, or an output's) until it is killed."""
    take = "RunDir(sys.argv[1]).lock()" if lock == "run" else "output_lock(sys.argv[1])"
    code = (f"import sys, time; from aiayn.files import output_lock; from aiayn.run import RunDir; held = {take}; held.__enter__(); "
            "print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_readers_of_a_run_in_progress_pin_one_checkpoint_and_survive_its_rotation(tmp_path, model_dir, capsys,
                                                                                  monkeypatch):
    """Found in review, with a run training beside the reader: a checkpoint deleted while it was
    read failed as "no config.json" or "cut short"; a translation's record named one checkpoint
    and its lines came from the next (a resume then took a mix); nothing said which was read; an
    experiment folder was "neither a model folder nor a run folder"."""
    import aiayn.run

    run = tmp_path / "run"
    for step in (2, 4):
        shutil.copytree(model_dir, run / "checkpoints" / f"step_{step:08d}")
    (tmp_path / "in.txt").write_text("the cat\n")
    code, out, err = cli(capsys, "translate", run, "--input", tmp_path / "in.txt", "--beam", "1")
    assert code in (0, None) and "has no model/ (a run in progress?): using its newest checkpoint, step_00000004" in err
    real_load, deleted = aiayn.run.Transformer.load, []

    def rotated(folder, *args, **kwargs):  # the trainer deletes the checkpoint as the reader opens it
        if not deleted and Path(folder).name == "step_00000004":
            deleted.append(shutil.rmtree(folder))
        return real_load(folder, *args, **kwargs)

    monkeypatch.setattr(aiayn.run.Transformer, "load", rotated)
    model, _ = aiayn.run.load_for_inference(run)
    assert deleted and model.config.vocab_size > 0  # step 2's, looked up again
    deleted.clear()
    shutil.copytree(model_dir, run / "checkpoints" / "step_00000004")
    with pytest.raises(ValueError, match="step_00000004 was deleted while it was read: a run training in"):
        aiayn.run.load_for_inference(run / "checkpoints" / "step_00000004")
    (tmp_path / "table3").mkdir()
    (tmp_path / "table3" / "experiment.json").write_text("{}")
    one_line_error(*cli(capsys, "translate", tmp_path / "table3")[::2], "is a Table 3 experiment: give one of its rows")


def test_a_model_folder_older_than_the_runs_newest_checkpoint_is_passed_over(tmp_path, corpus_tsv, capsys):
    """Found in review: a run stopped at step 2 (its model/ written then), resumed, and killed at
    step 4 before it wrote model/ again; translate took the model/ of step 2 without a word. Now
    model/ records its step, and a newer checkpoint is taken instead, with a note saying why."""
    from aiayn.checkpoint import save_model, saved_step

    run = RunDir(tmp_path / "run")
    assert cli(capsys, *train_argv(corpus_tsv, run.path, "--max-steps", "2", "--save-every", "1"))[0] == 0
    assert saved_step(run.final) == 2 and run.model_dir() == run.final
    shutil.copytree(run.final, tmp_path / "model-2")
    assert cli(capsys, *train_argv(corpus_tsv, run.path, "--resume", "--max-steps", "4", "--save-every", "1"))[0] == 0
    assert saved_step(run.final) == 4 and run.model_dir() == run.final  # the run's own, of its last step
    shutil.rmtree(run.final)
    shutil.copytree(tmp_path / "model-2", run.final)  # what the kill would have left
    assert run.model_dir() == run.checkpoint(4)
    (tmp_path / "in.txt").write_text("the cat\n")
    code, _, err = cli(capsys, "translate", run.path, "--input", tmp_path / "in.txt", "--beam", "1")
    assert code in (0, None) and (f"{run.path}: its model/ is of step 2, older than its newest checkpoint (a resumed run "
                                  "still training, or killed before it wrote model/ again): using step_00000004") in err
    code, _, err = cli(capsys, "export-ct2", run.path, tmp_path / "ct2")  # the exports say it too (found in review)
    assert code in (0, None) and "its model/ is of step 2, older than its newest checkpoint" in err
    # Fine-tuning says it too, and records the checkpoint it started from: a later lookup of a run
    # still training could give another (found in review: resolved three times, without a word).
    code, out, err = cli(capsys, "train", "--init-from", run.path, "--corpus", corpus_tsv, "--out", tmp_path / "tuned",
                         "--max-steps", "1", "--max-tokens", "300", "--device", "cpu", "--eval-every", "1000")
    assert code == 0 and "its model/ is of step 2, older than its newest checkpoint" in out + err, err
    assert json.loads((tmp_path / "tuned" / "train_config.json").read_text())["init_from"] == str(run.checkpoint(4))
    save_model(Transformer.load(run.final), run.final, force=True)  # no step recorded: an imported model, or an older run's
    assert saved_step(run.final) is None and run.model_dir() == run.final


def test_each_step_has_its_own_rate_and_seed_its_loss_is_per_token_and_the_last_is_saved(tmp_path, corpus_tsv, capsys,
                                                                                          monkeypatch):
    """§5.3's rate at step_num = 1, 2, ... (as logged), dropout drawn from a seed of each step's
    own, the loss per target token, a checkpoint at a last step between --save-every boundaries,
    and a resumed run going on with each (found by mutation: the rate a step off, one seed for
    every step, the loss per sentence and no last checkpoint each passed every test)."""
    import aiayn.train
    from aiayn.optim import noam_lr

    seeds, real = [], aiayn.train.step_seed
    monkeypatch.setattr(aiayn.train, "step_seed", lambda *key: (seeds.append(key), real(*key))[1])
    run, common = RunDir(tmp_path / "run"), ("--save-every", "2", "--dropout", "0.1", "--label-smoothing", "0")
    assert cli(capsys, *train_argv(corpus_tsv, run.path, "--max-steps", "3", *common))[0] == 0
    assert [c.name for c in run.checkpoints()] == ["step_00000002", "step_00000003"]
    assert cli(capsys, *train_argv(corpus_tsv, run.path, "--max-steps", "5", "--resume", *common))[0] == 0
    assert [c.name for c in run.checkpoints()] == [f"step_{k:08d}" for k in (2, 3, 4, 5)]
    assert seeds == [(3, 0, k) for k in range(5)]  # train_argv's --seed 3, rank 0, steps counted from 0
    records = [r for r in run.read_log() if r["split"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["lr"] for r in records] == pytest.approx([noam_lr(k, 32, 20) for k in range(1, 6)], rel=1e-12)
    # Untrained, with logits of variance about 1 (hidden states of unit variance per dimension, a
    # table of d_model^-0.5), the loss per target token is ln V plus about half a nat; per
    # sentence it would be several times that (5 to 9 tokens a sentence here).
    assert math.log(300) < records[0]["loss"] < 1.5 * math.log(300)


def test_a_checkpoint_pruned_midway_leaves_litter_not_a_checkpoint(tmp_path, corpus_tsv, capsys, monkeypatch):
    """Found in review: the oldest checkpoint was deleted under its own name, so a kill midway left
    a step_N without its weights that `average` and --resume took for a checkpoint."""
    import aiayn.files

    run = RunDir(tmp_path / "run")
    assert cli(capsys, *train_argv(corpus_tsv, run.path, "--max-steps", "2", "--save-every", "1", "--keep-last", "2"))[0] == 0

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt  # as a Ctrl-C while the files are deleted

    monkeypatch.setattr(aiayn.files.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        run.save_checkpoint(3, Transformer.load(run.checkpoint(2)), torch.optim.Adam(Transformer.load(
            run.checkpoint(2)).parameters()), {}, keep_last=2)
    monkeypatch.undo()
    assert [c.name for c in run.checkpoints()] == ["step_00000002", "step_00000003"]
    assert [p.name for p in run.remove_litter()] and not any(p.name.startswith(".") for p in run.checkpoint_root.iterdir())


def test_a_launcher_count_that_is_no_number_is_said_by_its_name(tmp_path, corpus_tsv, capsys, monkeypatch):
    """Found in review: WORLD_SIZE=abc was "invalid literal for int() with base 10: 'abc'"."""
    monkeypatch.setenv("WORLD_SIZE", "abc")
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--max-steps", "1"))[::2],
                   "the environment's WORLD_SIZE is 'abc', not a whole number", "unset it")
    assert not (tmp_path / "run").exists()


def test_a_start_that_fails_before_any_work_leaves_no_folder_of_its_own(tmp_path, capsys):
    new, kept = tmp_path / "new", tmp_path / "kept"
    kept.mkdir()
    for out in (new, kept):
        one_line_error(*cli(capsys, "train", "--corpus", "nope", "--out", out, "--preset", "tiny")[::2], "unknown corpus 'nope'")
    assert not new.exists() and kept.is_dir()  # a folder the user made stays


def test_one_writer_per_run_folder_and_output(tmp_path, corpus_tsv, capsys):
    """train, train --resume, demo, experiment and average refuse a folder another process
    writes, in one line naming its PID; once the holder is killed (-9) the folder is free."""
    run, experiment, averaged = tmp_path / "run", tmp_path / "table3", tmp_path / "avg"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))[0] == 0
    holders = [hold_lock(run), hold_lock(experiment), hold_lock(averaged, "output_lock")]
    before = tree_of(run)  # the lock file now names the holder
    try:
        for argv, holder in ((train_argv(corpus_tsv, run, "--max-steps", "4", "--resume"), holders[0]),
                             (["demo", "--out", run, "--minutes", "0.05"], holders[0]),
                             (["experiment", "table3", "--scale", "tiny", "--out", experiment], holders[1]),
                             (["average", run, "--last", "2", "--out", averaged], holders[2])):
            one_line_error(*cli(capsys, *argv)[::2], "is being written by another process", f"PID {holder.pid}")
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert tree_of(run) == before
    assert sorted(path.name for path in experiment.iterdir()) == [".lock"]  # the refused start wrote no settings
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "3", "--resume"))[0] == 0
    assert log_steps(run)[-1] == 3
    assert cli(capsys, "average", run, "--last", "2", "--out", averaged)[0] == 0


def test_one_writer_per_output_file_and_folder(tmp_path, model_dir, capsys):
    """translate --output (--resume too), export-argos and every folder output (export-ct2 here; attention,
    preprocess, export-hf and average build theirs the same way, through atomic_dir) refuse an
    output another process writes: two translations mixed their lines in one file, and two
    exports replaced each other without a word (found in review). What a killed writer left
    beside a folder output goes with the next build of it, and only that."""
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    out, exported = tmp_path / "out.txt", tmp_path / "ct2"
    package = tmp_path / "en_es.argosmodel"
    holders = [hold_lock(out, "output_lock"), hold_lock(exported, "output_lock"), hold_lock(package, "output_lock")]
    try:
        for argv, holder in ((["translate", model_dir, "--input", tmp_path / "in.txt", "--output", out], holders[0]),
                             (["translate", model_dir, "--input", tmp_path / "in.txt", "--output", out, "--resume"],
                              holders[0]),
                             (["export-ct2", model_dir, exported], holders[1]),
                             (["export-argos", model_dir, package, "--source-lang", "en", "--target-lang", "es"],
                              holders[2])):
            one_line_error(*cli(capsys, *argv)[::2], "is being written by another process", f"PID {holder.pid}")
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    # nothing written; the holders' lock files stay (a kill -9 removes nothing) until the next writer's release
    assert sorted(path.name for path in tmp_path.iterdir()) == [".ct2.lock", ".en_es.argosmodel.lock", ".out.txt.lock", "in.txt"]
    litter = [tmp_path / ".ct2.k1ll3d_x.tmp", tmp_path / ".ct2.k1ll3d_x.old.tmp", tmp_path / ".ct2.b.k1ll3d_x.tmp"]
    for folder in litter:
        (folder / "model.bin").parent.mkdir()
        (folder / "model.bin").write_bytes(b"")
    assert cli(capsys, "export-ct2", model_dir, exported)[0] == 0
    assert [folder.exists() for folder in litter] == [False, False, True]  # the last is the output ct2.b's
    assert not (tmp_path / ".ct2.lock").exists()


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc/PID/stat's fourth field)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue  # gone meanwhile
    return found


def running(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def torchrun(argv: list, **kwargs) -> subprocess.Popen:
    """`aiayn ARGV` under torchrun, 2 gloo workers of one thread each, in a process group of its own.
    --standalone: the rendezvous store binds a port of the OS's choosing itself (a port chosen free
    here could be taken before torchrun bound it)."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1",
                             "--nproc-per-node", "2",
                             "-m", "aiayn", *map(str, argv)],
                            start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)


def test_workers_of_a_killed_torchrun_stop_with_a_checkpoint_and_resume_exactly(tmp_path, corpus_tsv):
    """SIGKILL to torchrun, which cannot pass it on: its workers get SIGTERM from the kernel
    (PR_SET_PDEATHSIG), stop after the same step with a checkpoint and let the folder go; a
    resume under torchrun then logs, step for step, the losses of an uninterrupted run (dropout
    on: every rank's random draws must be the ones it would have made)."""
    steps = 40
    argv = lambda run, *extra: train_argv(corpus_tsv, run, "--max-steps", steps, "--save-every", 10**5,  # noqa: E731
                                          "--dropout", "0.1", *extra)
    straight = torchrun(argv(tmp_path / "straight"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert straight.wait(timeout=300) == 0, straight.stderr.read()[-3000:]
    run = tmp_path / "run"
    launcher = torchrun(argv(run), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not ((run / "log.jsonl").exists() and len(log_steps(run)) >= 2):
            assert launcher.poll() is None and time.monotonic() < deadline, "the workers did not start training"
            time.sleep(0.02)
        workers = children_of(launcher.pid)
        launcher.kill()
        launcher.wait()
        assert len(workers) == 2
        deadline = time.monotonic() + 120
        while any(running(pid) for pid in workers):
            assert time.monotonic() < deadline, "the workers of a killed torchrun went on"
            time.sleep(0.2)
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)  # whatever is left of the group, if the test failed
        except ProcessLookupError:
            pass
    stopped = log_steps(run)[-1]
    assert stopped < steps and RunDir(run).checkpoints()[-1].name == f"step_{stopped:08d}"
    resumed = torchrun(argv(run, "--resume"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-3000:]
    assert losses(run) == losses(tmp_path / "straight") and len(losses(run)) == steps


def test_a_time_budget_under_torchrun_ends_every_rank_after_the_same_step(tmp_path, corpus_tsv):
    """Found in review: each rank counted its own time against --minutes; a rank that waited in
    a collective while rank 0 validated ran out first and left the loop, and rank 0's next step
    waited for it for ever. The ranks now count their mean, agreed at each step's end."""
    run = tmp_path / "run"
    process = torchrun(train_argv(corpus_tsv, run, "--minutes", "0.1", "--eval-every", "3", "--max-steps", 10**6),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, out[-3000:]
    assert (run / "model" / "model.safetensors").is_file()
    assert RunDir(run).checkpoints()[-1].name == f"step_{log_steps(run)[-1]:08d}"


# --- 2. a tokenizer left by a failed start ----------------------------------------------------

def test_a_tokenizer_from_other_data_is_not_reused(tmp_path, corpus_tsv, capsys):
    from aiayn.tokenizer import copy_tokenizer
    from aiayn.corpora import load_corpus
    from aiayn.store import preprocess

    run = tmp_path / "run"
    # A start that fails on its settings fails before it writes anything.
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, run, "--device", "cuda"))[::2], "no CUDA GPU")
    assert not (run / "tokenizer.model").exists()
    # A start that failed later (here: stopped after preprocessing) left the toy corpus's data
    # and tokenizer, and its lock, which says they are a start's.
    with RunDir(run).lock():
        preprocess(load_corpus(str(corpus_tsv)), run / "data", 300, spec=str(corpus_tsv), echo=lambda _: None)
        copy_tokenizer(run / "data", run)
    toy = (run / "tokenizer.model").read_bytes()
    chinese = tmp_path / "zh.tsv"
    chinese.write_text("".join(f"猫在河边看见狗{i}\t狗在桥下吃鱼{i}\n" for i in range(200)), encoding="utf-8")
    code, out, _ = cli(capsys, *train_argv(chinese, run, "--max-steps", "1"))
    assert code == 0 and "made from other data" in out
    assert (run / "tokenizer.model").read_bytes() != toy
    tokenizer = Tokenizer.load(run)
    assert len(tokenizer.encode("猫在河边")) < 4  # learnt pieces, not 12 UTF-8 byte pieces
    # A resumed run keeps the tokenizer its checkpoints were trained with, and says so.
    code, out, _ = cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--resume"))
    assert code == 0 and "note: --corpus is not applied" in out and "with the data it began with" in out
    assert Tokenizer.load(run).model_proto == tokenizer.model_proto


# --- 3. and 4. translate: lines as wc -l counts them, streamed, resumable ------------------------

SEPARATORS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\r"


def test_translate_and_score_split_lines_on_newline_only(tmp_path, model_dir, capsys):
    text = f"the small cat{SEPARATORS}sees a dog\na red bird\x0ceats the fish\nthe big dog\u2028likes the cat\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt",
                       "--beam", "1")
    assert code == 0, err
    out = (tmp_path / "out.txt").read_bytes()
    assert out.count(b"\n") == 3 and out.endswith(b"\n")
    assert all(ch not in out.decode() for ch in SEPARATORS)  # one line out for each line in
    (tmp_path / "ref.txt").write_text(text, encoding="utf-8")
    code, out, err = cli(capsys, "score", "--ref", tmp_path / "ref.txt", "--hyp", tmp_path / "in.txt")
    assert code == 0 and "sacreBLEU       100.00" in out, err


def interrupt_on_chunk(chunk: int, monkeypatch, name: str = "translate_nbest"):
    """Ctrl-C as `translate` decodes its `chunk`-th chunk (through `name`, the function each chunk
    calls); returns the real function."""
    real, calls = getattr(translate_module, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == chunk:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(translate_module, name, interrupted)
    return real


def test_translate_streams_chunks_to_a_partial_file_that_resume_completes(tmp_path, model_dir, capsys, monkeypatch):
    lines = [SENTENCES[i % 7] if i % 5 else "" for i in range(11)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "2"]
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 3)
    assert cli(capsys, *argv, "--output", tmp_path / "new" / "straight.txt")[0] == 0  # its folder made, as --out's are
    straight = (tmp_path / "new" / "straight.txt").read_text(encoding="utf-8")
    assert straight.count("\n") == 11

    real = interrupt_on_chunk(3, monkeypatch)
    out = tmp_path / "out.txt"
    code, _, err = cli(capsys, *argv, "--output", out)
    assert code == 130 and "6 finished lines are in" in err and "--resume" in err
    assert not out.exists() and (tmp_path / "out.txt.partial").read_text(encoding="utf-8").count("\n") == 6
    with open(tmp_path / "out.txt.partial", "ab") as handle:
        handle.write(b"half a li")  # a kill in the middle of a write
    one_line_error(*cli(capsys, *argv, "--output", out)[::2], "interrupted translation", "--resume")
    (tmp_path / "short.txt").write_text("the cat\n", encoding="utf-8")
    short = ["translate", model_dir, "--input", tmp_path / "short.txt", "--output", out, "--resume"]
    one_line_error(*cli(capsys, *short)[::2], "translates another input", "--force starts over")
    record = tmp_path / "out.txt.partial.json"
    record.rename(tmp_path / "kept.json")  # a partial from before inputs were recorded: the line count still tells
    one_line_error(*cli(capsys, *short)[::2], "holds 6 lines but", "has 1", "same input")
    (tmp_path / "kept.json").rename(record)
    (tmp_path / "other.txt").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")  # as long, not the same
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "other.txt", "--output", out, "--resume")
    one_line_error(code, err, "translates another input", "--force starts over")
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    with open(tmp_path / "out.txt.partial", "ab") as handle:
        handle.write(b"a whole line written after the record\n")  # a kill between the lines and their record
    litter = tmp_path / ".out.txt.partial.json.k1389ia9.tmp"
    litter.write_text("{")  # a kill while the record was rewritten (found in review: it stayed for good)
    assert cli(capsys, *argv, "--output", out, "--resume")[0] == 0
    assert out.read_text(encoding="utf-8") == straight and not (tmp_path / "out.txt.partial").exists()
    assert not litter.exists()
    assert not (tmp_path / "out.txt.partial.json").exists()
    one_line_error(*cli(capsys, *argv, "--output", out)[::2], "already exists", "--force")
    one_line_error(*cli(capsys, *argv, "--output", out, "--resume")[::2], "is complete")
    assert cli(capsys, *argv, "--output", out, "--force")[0] == 0


def test_translate_never_writes_over_what_it_reads(tmp_path, model_dir, capsys):
    """Not with --force either: the model's files, a folder, a device or a pipe."""
    model = Path(shutil.copytree(model_dir, tmp_path / "model"))
    weights = (model / "model.safetensors").read_bytes()
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    argv = ["translate", model, "--input", tmp_path / "in.txt", "--force", "--output"]
    for inside in ("model.safetensors", "tokenizer.model", "new.txt"):
        one_line_error(*cli(capsys, *argv, model / inside)[::2], "lies inside", "an input of this command")
    assert (model / "model.safetensors").read_bytes() == weights
    (tmp_path / "folder").mkdir()
    one_line_error(*cli(capsys, *argv, tmp_path / "folder")[::2], "is a folder; --output names a file")
    os.mkfifo(tmp_path / "pipe")
    one_line_error(*cli(capsys, *argv, tmp_path / "pipe")[::2], "not a regular file or folder")
    assert (tmp_path / "pipe").is_fifo()
    (tmp_path / "in.txt").rename(tmp_path / "out.partial")  # the input is the file the output is first written to
    for flag in ("--force", "--resume"):
        one_line_error(*cli(capsys, "translate", model, "--input", tmp_path / "out.partial", "--output", tmp_path / "out",
                            flag)[::2], "is an input of this command")
    assert (tmp_path / "out.partial").read_text(encoding="utf-8") == "the cat\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder", "model", "out.partial", "pipe"]


def test_resume_needs_the_same_model_settings_and_input(tmp_path, model_dir, capsys, monkeypatch):
    """Lines of two models or two beams in one file would pass for one translation."""
    lines = "".join(f"{SENTENCES[i % 7]}\n" for i in range(9)).encode()
    out = tmp_path / "out.txt"
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 3)
    real = interrupt_on_chunk(2, monkeypatch)
    argv = ["translate", model_dir, "--output", out, "--beam", "2"]
    assert cli(capsys, *argv, stdin=lines, monkeypatch=monkeypatch)[0] == 130
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    one_line_error(*cli(capsys, *argv, "--resume", "--alpha", "1", stdin=lines, monkeypatch=monkeypatch)[::2],
                   "was translated with another --alpha (0.6);", "same model and settings")
    other = make_model(tmp_path / "other", positional="learned")
    one_line_error(*cli(capsys, "translate", other, *argv[2:], "--resume", stdin=lines, monkeypatch=monkeypatch)[::2],
                   "another model")
    short = lines[: lines.index(b"\n") + 1]
    one_line_error(*cli(capsys, *argv, "--resume", stdin=short, monkeypatch=monkeypatch)[::2],
                   "has 1 lines, fewer than the 3", "same input")
    other = b"".join(f"{SENTENCES[(i + 1) % 7]}\n".encode() for i in range(9))  # as long, not the same
    one_line_error(*cli(capsys, *argv, "--resume", stdin=other, monkeypatch=monkeypatch)[::2],
                   "stdin is not the input", "first 3 lines differ", "--force starts over")
    assert out.with_name("out.txt.partial").read_text(encoding="utf-8").count("\n") == 3
    code, _, err = cli(capsys, *argv, "--resume", "--batch-tokens", "100", stdin=lines, monkeypatch=monkeypatch)
    assert code == 0, err  # a speed knob may change
    assert out.read_text(encoding="utf-8").count("\n") == 9
    for output in ((), ("--output", "-")):  # was ignored: the whole input translated to stdout again
        one_line_error(*cli(capsys, "translate", model_dir, *output, "--resume", stdin=lines, monkeypatch=monkeypatch)[::2],
                       "--resume continues the file of --output; without one the lines go to stdout")


def test_resume_with_nothing_to_resume_says_so_and_translates_it_all(tmp_path, model_dir, capsys, monkeypatch):
    """A script that always passes --resume starts the first time; said, not silent (found by a
    newcomer's run of the README)."""
    out = tmp_path / "out.txt"
    code, _, err = cli(capsys, "translate", model_dir, "--output", out, "--beam", "1", "--resume",
                       stdin=b"the cat\nthe dog\n", monkeypatch=monkeypatch)
    assert code == 0 and out.read_text(encoding="utf-8").count("\n") == 2, err
    assert f"aiayn: note: nothing to resume: there is no {out}.partial; translating from the first line" in err
    code, _, err = cli(capsys, "translate", model_dir, "--output", out, "--beam", "1", "--force",
                       stdin=b"the cat\n", monkeypatch=monkeypatch)
    assert code == 0 and "nothing to resume" not in err  # without --resume there is nothing to say


def test_an_input_that_is_a_folder_is_said_before_the_output_inside_it(tmp_path, model_dir, capsys, monkeypatch):
    """The output's check named the folder "an input of this command", hiding the mistake: the
    input is no file (found by a newcomer's run of the README)."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for output in (folder / "out.txt", tmp_path / "out.txt"):
        code, _, err = cli(capsys, "translate", model_dir, "--input", folder, "--output", output, monkeypatch=monkeypatch)
        one_line_error(code, err, f"{folder} is a folder, not a file")
        assert not output.exists() and not output.with_name("out.txt.partial").exists()
    one_line_error(*cli(capsys, "translate", model_dir, "--input", tmp_path / "nope.txt", "--output", folder / "out.txt",
                        monkeypatch=monkeypatch)[::2], f"no such file: {tmp_path / 'nope.txt'}")


def test_output_dash_is_stdout_as_input_dash_is_stdin(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a file named - would be written
    code, out, err = cli(capsys, "translate", model_dir, "--input", "-", "--output", "-", "--beam", "1",
                         stdin=b"the cat\nthe dog\n", monkeypatch=monkeypatch)
    assert code == 0 and out.count("\n") == 2, err
    assert not (tmp_path / "-").exists()


def test_a_search_too_large_is_a_one_line_error(tmp_path, model_dir, capsys, monkeypatch):
    """Too long: the search's key/value cache for 10^12 positions is over 128 TiB, more than any
    process's address space, so the allocation fails whatever the machine's memory and overcommit
    setting. Too wide: a beam of more outputs than the vocabulary has tokens."""
    code, _, err = cli(capsys, "translate", model_dir, "--extra-len", str(10 ** 12), stdin=b"the cat\n",
                       monkeypatch=monkeypatch)
    one_line_error(code, err, "out of memory", "--extra-len")
    vocab = Tokenizer.load(model_dir).vocab_size
    wide = ["--beam", str(vocab + 1)]
    for argv in (["translate", model_dir, *wide], ["attention", model_dir, *wide, "--sentence", "the cat", "--out", tmp_path]):
        code, _, err = cli(capsys, *argv, stdin=b"the cat\n", monkeypatch=monkeypatch)  # it failed inside the search
        one_line_error(code, err, f"beam {vocab + 1} is more than the model's {vocab} tokens")


def test_translate_writes_each_chunk_when_done(model_dir):
    model, tokenizer = Transformer.load(model_dir).eval(), Tokenizer.load(model_dir)
    written = []
    count = translate_module.translate_stream(model, tokenizer, iter(SENTENCES[:7]), written.append, chunk_lines=3)
    assert count == 7 and [len(chunk) for chunk in written] == [3, 3, 1]


def test_translate_chunks_grow_from_a_small_first_one(model_dir, monkeypatch):
    """So that a short file interrupted keeps most of what was decoded, not nothing."""
    model, tokenizer = Transformer.load(model_dir).eval(), Tokenizer.load(model_dir)
    monkeypatch.setattr(translate_module, "FIRST_CHUNK_LINES", 2)
    written = []
    count = translate_module.translate_stream(model, tokenizer, iter(SENTENCES[:14]), written.append, chunk_lines=5, beam=1)
    assert count == 14 and [len(chunk) for chunk in written] == [2, 4, 5, 3]


def test_a_resumed_translation_batches_each_line_with_the_lines_an_uninterrupted_one_does(tmp_path, model_dir, capsys,
                                                                                         monkeypatch):
    """In int8 (and bf16) a line's translation can depend on the lines batched beside it: a
    resumed run cuts its chunks where an uninterrupted one does (found in review: it began
    them anew at the resume, and 116 of 200 int8 lines came out otherwise); a --batch-tokens
    other than the partial's is said."""
    (tmp_path / "in.txt").write_text("".join(f"{SENTENCES[i % 7]}\n" for i in range(11)), encoding="utf-8")
    monkeypatch.setattr(translate_module, "FIRST_CHUNK_LINES", 2)
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 4)  # chunks of 2, 4, 4 and 1 lines
    real, seen = translate_module.translate_nbest, []
    monkeypatch.setattr(translate_module, "translate_nbest", lambda model, sources, *a, **k: seen.append(len(sources))
                        or real(model, sources, *a, **k))
    argv = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "1", "--precision", "int8", "--output"]
    assert cli(capsys, *argv, tmp_path / "straight.txt")[0] == 0 and seen == [2, 4, 4, 1]
    spy = translate_module.translate_nbest
    interrupt_on_chunk(3, monkeypatch)  # after lines 1 to 6
    assert cli(capsys, *argv, tmp_path / "out.txt")[0] == 130
    monkeypatch.setattr(translate_module, "translate_nbest", spy)
    seen.clear()
    code, _, err = cli(capsys, *argv, tmp_path / "out.txt", "--resume", "--batch-tokens", "500")
    assert code == 0 and seen == [4, 1]  # lines 7 to 10, then 11: as the uninterrupted run (was 2, then 3)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == (tmp_path / "straight.txt").read_text(encoding="utf-8")
    assert "was translated with --batch-tokens (4000): in int8 a line's translation can differ" in err


def test_n_best_writes_n_lines_per_input_line_and_a_resume_continues_whole_lines(tmp_path, model_dir, capsys,
                                                                                  monkeypatch):
    lines = [SENTENCES[i % 7] if i % 4 else "" for i in range(7)]
    (tmp_path / "in.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    argv = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "3", "--n-best", "3", "--output"]
    one_line_error(*cli(capsys, *argv[:-2], "4", "--output", tmp_path / "x.txt")[::2],
                   "--n-best 4 needs --beam 4 or more")
    assert not (tmp_path / "x.txt.partial").exists()
    assert cli(capsys, *argv, tmp_path / "straight.txt")[0] == 0
    written = (tmp_path / "straight.txt").read_text(encoding="utf-8").splitlines()
    translator = translate_module.Translator.load(model_dir, "cpu", DecodeConfig(beam=3))
    for line, group in zip(lines, (written[i : i + 3] for i in range(0, len(written), 3)), strict=True):
        best = translator.translate_nbest([translator.tokenizer.encode(line)], 3)[0] if line else []
        assert group == [translator.tokenizer.decode(ids) for ids in best] + [""] * (3 - len(best))
    monkeypatch.setattr(translate_module, "FIRST_CHUNK_LINES", 2)
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 4)
    real = interrupt_on_chunk(2, monkeypatch)  # after input lines 1 and 2: 6 output lines
    out = tmp_path / "out.txt"
    code, _, err = cli(capsys, *argv, out)
    assert code == 130 and "the 3 lines of each of 2 finished input lines are in" in err
    assert (tmp_path / "out.txt.partial").read_text(encoding="utf-8").splitlines() == written[:6]
    with open(tmp_path / "out.txt.partial", "ab") as handle:
        handle.write(b"one of the next line's alternatives\n")  # a kill amid a write, past the record
    one_line_error(*cli(capsys, *argv[:-2], "2", "--output", out, "--resume")[::2],
                   "was translated with another --n-best (3)")
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    assert cli(capsys, *argv, out, "--resume")[0] == 0
    assert out.read_text(encoding="utf-8").splitlines() == written
    # A partial from before --n-best was recorded translated one line a line (found in review: a
    # resume with --n-best 3 passed the check, then cut the partial to a third and refused it).
    plain = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "3", "--output", tmp_path / "old.txt"]
    interrupt_on_chunk(2, monkeypatch)
    assert cli(capsys, *plain)[0] == 130
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    record = tmp_path / "old.txt.partial.json"
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "--n-best"}))
    kept = (tmp_path / "old.txt.partial").read_bytes()
    one_line_error(*cli(capsys, *plain, "--n-best", "3", "--resume")[::2], "was translated with another --n-best (1)")
    assert (tmp_path / "old.txt.partial").read_bytes() == kept
    assert cli(capsys, *plain, "--resume")[0] == 0


def test_cuda_graphs_that_cannot_be_used_are_said_in_a_note(tmp_path, capsys, monkeypatch):
    """On a GPU, a model with restricted self-attention decodes without graphs: said, as on a CPU
    (the GPU faked: the note reads only the model's device, and the step checks the tensors')."""
    restricted = make_model(tmp_path / "restricted", neighborhood=4)
    monkeypatch.setattr(translate_module.Translator, "device", property(lambda self: torch.device("cuda")))
    code, out, err = cli(capsys, "translate", restricted, "--cuda-graphs", "true", stdin=b"the cat\n", monkeypatch=monkeypatch)
    assert code == 0 and out.count("\n") == 1
    assert "--cuda-graphs needs a CUDA GPU and full self-attention: with this model's restricted self-attention" in err


def test_an_unwritable_output_fails_before_decoding(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setattr(translate_module, "translate_nbest", lambda *a, **k: pytest.fail("decoded"))
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("kept\n", encoding="utf-8")
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt",
                       "--output", tmp_path / "notes.txt" / "out.txt")
    one_line_error(code, err, f"{tmp_path / 'notes.txt'} is a file, not a folder")
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--precision", "fp16",
                       "--output", tmp_path / "new" / "folders" / "out.txt")  # refused after its folders were made
    one_line_error(code, err, "fp16 needs a CUDA GPU")
    assert not (tmp_path / "new").exists()  # the folders made for the output go with it
    # The system's errors said of the path given, not as "[Errno 21] Is a directory: '...'".
    one_line_error(*cli(capsys, "translate", model_dir, "--input", tmp_path)[::2], f"{tmp_path} is a folder, not a file")
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "in.txt", "--hyp", tmp_path / "none.txt")[::2],
                   f"no such file: {tmp_path / 'none.txt'}")
    code, _, err = cli(capsys, "corpus", "export", "bible-en-es", "--out", tmp_path / "in.txt")
    one_line_error(code, err, f"{tmp_path / 'in.txt'} is a file, not a folder")
    code, _, err = cli(capsys, "experiment", "table3", "--out", tmp_path / "in.txt" / "table3")
    one_line_error(code, err, f"{tmp_path / 'in.txt'} is a file, not a folder")
    one_line_error(*cli(capsys, "translate", tmp_path / "nope")[::2], f"no such model or run folder: {tmp_path / 'nope'}")
    half = tmp_path / "half"  # a model folder copied without its weights (found in review: "neither a model folder ...")
    half.mkdir()
    shutil.copy(model_dir / "config.json", half)
    one_line_error(*cli(capsys, "translate", half)[::2], f"{half} lacks model.safetensors (it holds config.json)")
    one_line_error(*cli(capsys, "average", tmp_path / "nope", "--out", tmp_path / "avg")[::2],
                   f"no such run folder: {tmp_path / 'nope'}")


def test_a_run_whose_checkpoints_cannot_be_written_is_refused_before_a_step(tmp_path, tiny_run, capsys):
    """Found in review: a resumed run with a read-only checkpoints/ trained its steps, then failed
    at the first save, and the steps were lost."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    checkpoints = run / "checkpoints"
    checkpoints.chmod(0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", checkpoints], capture_output=True).returncode != 0:
        pytest.skip("root writes through permission bits, and chattr +i is not allowed here")
    try:
        one_line_error(*cli(capsys, "train", "--out", run, "--resume", "--device", "cpu", "--max-steps", "20")[::2],
                       f"cannot write in {checkpoints}:")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", checkpoints], check=True)
        checkpoints.chmod(0o755)
    assert max(log_steps(run)) == max(log_steps(tiny_run))  # no step trained


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_work(tmp_path, model_dir, capsys, monkeypatch):
    """Found by making a file there, before decoding or drawing: root writes through permission
    bits, so for root the folder is made immutable."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", folder], capture_output=True).returncode != 0:
        pytest.skip("root writes through permission bits, and chattr +i is not allowed here")
    monkeypatch.setattr(translate_module, "translate_nbest", lambda *a, **k: pytest.fail("decoded"))
    try:
        for argv in (["translate", model_dir, "--output", folder / "out.txt"],
                     ["attention", model_dir, "--sentence", "the cat", "--out", folder / "maps" / "new"]):
            one_line_error(*cli(capsys, *argv, stdin=b"the cat\n", monkeypatch=monkeypatch)[::2],
                           f"cannot write in {folder}:")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", folder], check=True)
        folder.chmod(0o755)
    assert not any(folder.iterdir())
    # found in review: in a folder that exists but where no file can be made, translate tried forever
    one_line_error(*cli(capsys, "translate", model_dir, "--output", "/proc/out.txt", stdin=b"the cat\n",
                        monkeypatch=monkeypatch)[::2], "cannot write in /proc")
    # and an output inside the model, refused, made its lock and folder there first
    before = sorted(model_dir.iterdir()), model_dir.stat().st_mtime_ns
    one_line_error(*cli(capsys, "translate", model_dir, "--output", model_dir / "sub" / "out.txt", stdin=b"the cat\n",
                        monkeypatch=monkeypatch)[::2], "an input of this command")
    assert (sorted(model_dir.iterdir()), model_dir.stat().st_mtime_ns) == before
    one_line_error(*cli(capsys, "translate", model_dir, "--lang", "de", stdin=b"the cat\n", monkeypatch=monkeypatch)[::2],
                   "--lang is the language --split-sentences splits by")


def test_a_line_too_long_for_learned_positions_is_cut_not_fatal(tmp_path, capsys):
    model_dir = make_model(tmp_path / "learned", positional="learned", max_len=16)
    (tmp_path / "in.txt").write_text("the cat\n" + "the big dog " * 30 + "\na red bird\n", encoding="utf-8")
    code, _, err = cli(capsys, "translate", model_dir, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt")
    assert code == 0, err
    assert "line 2 has" in err and "first 15" in err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 3


# --- 5. and 6. train: stopped by a signal, resumed from what a crash left ----------------------

def run_cli(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "aiayn", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, **kwargs)


# Runs are signalled or killed early in their STEPS steps: a wide margin, on a fast CPU, between
# the step the test sees in the log and the step the signal arrives at.
STEPS = 60


@pytest.fixture(scope="module")
def straight_run(corpus_tsv, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    done = run_cli(*train_argv(corpus_tsv, run, "--max-steps", str(STEPS), "--save-every", "10"))
    assert done.returncode == 0, done.stderr
    return run


def wait_for_step(process, run: Path, step: int) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "log.jsonl").exists() and max(log_steps(run), default=0) >= step:
            return
        time.sleep(0.02)
    pytest.fail("the run ended before the signal")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_checkpoint_and_resume_is_exact(tmp_path, corpus_tsv, straight_run, signum):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "aiayn", *train_argv(corpus_tsv, run, "--max-steps", str(STEPS), "--save-every", "1000")]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(process, run, 8)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err  # 143 for SIGTERM, 130 for Ctrl-C
    stopped = max(log_steps(run))
    assert stopped < STEPS and RunDir(run).checkpoints()[-1].name == f"step_{stopped:08d}"  # not one step lost
    assert f"stopped by {signal.Signals(signum).name} at step {stopped}" in out
    assert (run / "model" / "model.safetensors").exists()
    again = run_cli(*train_argv(corpus_tsv, run, "--max-steps", str(STEPS), "--save-every", "1000", "--resume"))
    assert again.returncode == 0, again.stderr
    assert log_steps(run) == list(range(1, STEPS + 1))  # no step logged twice
    assert losses(run) == losses(straight_run)  # bit for bit


def test_a_signal_during_validation_stops_it_without_another_step(tmp_path, corpus_tsv, capsys, monkeypatch):
    """Found in review: a SIGINT two seconds into validation waited for its whole BLEU pass (263 s
    with 300 sentences), then trained one more step, past a scheduler's grace period."""
    import aiayn.train

    monkeypatch.setattr(aiayn.train, "VALIDATION_CHUNK", 1)  # a look at the signal after every sentence
    real, calls = aiayn.train.Translator.translate, []

    def signalled(self, sentences, *args, **kwargs):  # Ctrl-C while the first dev sentence is translated
        calls.append(len(sentences))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(aiayn.train.Translator, "translate", signalled)
    corpus, lines = tmp_path / "corpus", corpus_tsv.read_text(encoding="utf-8").splitlines(keepends=True)
    corpus.mkdir()
    (corpus / "train.tsv").write_text("".join(lines[:250]), encoding="utf-8")
    (corpus / "dev.tsv").write_text("".join(lines[250:]), encoding="utf-8")
    run = tmp_path / "run"
    code, out, err = cli(capsys, *train_argv(corpus, run, "--max-steps", "10", "--eval-every", "3"))
    assert code == 130, err
    assert calls == [1] and log_steps(run) == [1, 2, 3]  # no dev record, no step 4
    assert RunDir(run).checkpoints()[-1].name == "step_00000003"
    assert "validation of step 3 left off for the SIGINT" in out and "stopped by SIGINT at step 3" in out
    # Found by a fault hunt: the resumed run never validated step 3, so its log lacked that dev record for good.
    code, out, err = cli(capsys, *train_argv(corpus, run, "--max-steps", "10", "--eval-every", "3", "--resume"))
    assert code == 0, err
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "dev"] == [3, 6, 9]
    assert log_steps(run) == sorted(log_steps(run)) and [r["step"] for r in records if r["split"] == "train"] == list(range(1, 11))


def test_a_resumed_run_does_not_validate_again_a_step_it_validated(tmp_path, corpus_tsv, capsys):
    """The validation a stop left off is owed on resume (above); one the log holds is not. Found
    by mutation testing: validating the step resumed from whatever the log held passed every
    test, and each resume at such a step spent a validation and logged a second dev record of it."""
    corpus, lines = tmp_path / "corpus", corpus_tsv.read_text(encoding="utf-8").splitlines(keepends=True)
    corpus.mkdir()
    (corpus / "train.tsv").write_text("".join(lines[:250]), encoding="utf-8")
    (corpus / "dev.tsv").write_text("".join(lines[250:]), encoding="utf-8")
    run = tmp_path / "run"
    assert cli(capsys, *train_argv(corpus, run, "--max-steps", "4", "--eval-every", "2"))[0] == 0
    code, out, err = cli(capsys, *train_argv(corpus, run, "--max-steps", "6", "--eval-every", "2", "--resume"))
    assert code == 0 and "resumed from" in out, err
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "dev"] == [2, 4, 6]


def test_a_signal_after_the_last_step_stops_the_command_too(tmp_path, corpus_tsv, capsys, monkeypatch):
    """Found by a fault hunt: a SIGTERM while the last step's checkpoint or model/ was written was
    taken by the trainer's handler and forgotten: train said "done", exit 0, and `demo` went on to
    minutes of averaging and decoding past a scheduler's grace period."""
    real = RunDir.save_final

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunDir, "save_final", signalled)
    run = tmp_path / "run"
    code, out, err = cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "3"))
    assert code == 143, err
    assert "stopped by SIGTERM at step 3" in out and "its training is complete" in out and "done at" not in out
    assert (run / "model" / "model.safetensors").exists() and RunDir(run).checkpoints()[-1].name == "step_00000003"


def test_leftovers_of_an_output_another_process_writes_are_left_to_it(tmp_path):
    """A run starting again clears its outputs' hidden leftovers each under that output's lock
    (files.remove_leftovers): the folder another process is building an output in now (an
    `average --out RUN/averaged` beside the run) is not litter and stays; once that writer is
    gone (killed), it is. Found by mutation testing: clearing them without the lock passed every
    test."""
    from aiayn.files import remove_leftovers

    building = tmp_path / ".averaged.k3j4h5g6.tmp" / "averaged"
    building.mkdir(parents=True)
    (building / "config.json").write_text("{}")
    litter = tmp_path / ".log.jsonl.x1y2z3w4.tmp"
    litter.write_text("")
    holder = hold_lock(tmp_path / "averaged", "output_lock")
    try:
        assert remove_leftovers([building.parent, litter]) == [litter]
        assert (building / "config.json").read_text() == "{}" and not litter.exists()
    finally:
        holder.kill()
        holder.wait()
    assert remove_leftovers([building.parent]) == [building.parent] and not building.parent.exists()


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_full_disk_under_the_log_and_a_translation_names_the_file(tmp_path, model_dir):
    """Found by a fault hunt: `[Errno 27] File too large` alone, naming no file, when the log or
    a translation's OUTPUT.partial hit the limit (checkpoints and folders said theirs)."""
    log = tmp_path / "run" / "log.jsonl"
    log.parent.mkdir()
    code = f"from aiayn.run import RunDir; RunDir({str(log.parent)!r}).append_log({{'step': 1, 'x': 'a' * 5000}})"
    done = subprocess.run(["prlimit", "--fsize=4096", sys.executable, "-c", code], capture_output=True, text=True)
    assert f"OSError: cannot write {log}: File too large" in done.stderr, done.stderr
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    done = subprocess.run(["prlimit", "--fsize=2048", sys.executable, "-m", "aiayn", "translate", str(model_dir), "--input",
                           str(source), "--output", str(out), "--beam", "1", "--device", "cpu"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.endswith(f"aiayn: error: cannot write {out}.partial: File too large\n"), done.stderr
    again = run_cli("translate", model_dir, "--input", source, "--output", out, "--beam", "1", "--device", "cpu", "--resume")
    assert again.returncode == 0, again.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(SENTENCES) * 3


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing_half_written(tmp_path, corpus_tsv, capsys):
    """A file size limit of 4 KB (prlimit --fsize: writes past it fail with EFBIG, as on a full
    disk) while train writes a checkpoint, average its folder, export-hf its weights, export-argos
    its package (its naming found by mutation testing: untested)."""
    run, data = tmp_path / "run", tmp_path / "data"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--save-every", "1"))[0] == 0
    assert cli(capsys, "preprocess", "--corpus", corpus_tsv, "--out", data, "--vocab-size", "300")[0] == 0

    def limited(*argv):
        return subprocess.run(["prlimit", "--fsize=4096", sys.executable, "-m", "aiayn", *map(str, argv)],
                              capture_output=True, text=True, timeout=300)

    train = train_argv(corpus_tsv, tmp_path / "run2", "--max-steps", "2")
    train[train.index("--corpus"):train.index("--corpus") + 2] = ["--data", str(data)]
    cases = [(["average", run, "--last", "2", "--out", tmp_path / "avg"], tmp_path / "avg"),
             (["export-hf", run, tmp_path / "hf"], tmp_path / "hf"),
             (["export-argos", run, tmp_path / "en_es.argosmodel", "--source-lang", "en", "--target-lang", "es"],
              tmp_path / "en_es.argosmodel"),
             (train, tmp_path / "run2")]
    for argv, out in cases:
        done = limited(*argv)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
        assert done.stderr.startswith(f"aiayn: error: cannot write {out}"), done.stderr
        assert not (out / "model.safetensors").exists() and not (out / "checkpoints").exists() and not out.is_file()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".step_")]


def test_a_run_killed_before_its_first_checkpoint_logs_each_step_once(tmp_path, corpus_tsv):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "aiayn", *train_argv(corpus_tsv, run, "--max-steps", str(STEPS), "--save-every", "1000")]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_step(process, run, 5)
    process.kill()
    process.wait()
    assert not RunDir(run).checkpoints()
    refused = run_cli(*train_argv(corpus_tsv, run, "--max-steps", "20"))
    assert refused.returncode == 2 and "--resume" in refused.stderr
    again = run_cli(*train_argv(corpus_tsv, run, "--max-steps", "20", "--resume"))
    assert again.returncode == 0, again.stderr
    assert log_steps(run) == list(range(1, 21))


def test_a_resumed_runs_records_average_the_same_steps_as_an_uninterrupted_runs(tmp_path, corpus_tsv, capsys):
    """Found in review: resumed at step 7 with --log-every 4, the step-8 record averaged steps 7-8
    where an uninterrupted run's averages 5-8. The window's sums are in the checkpoint now."""
    every = ["--log-every", "4", "--save-every", "3"]
    assert cli(capsys, *train_argv(corpus_tsv, tmp_path / "straight", "--max-steps", "12", *every))[0] == 0
    assert cli(capsys, *train_argv(corpus_tsv, tmp_path / "cut", "--max-steps", "7", *every))[0] == 0
    assert cli(capsys, *train_argv(corpus_tsv, tmp_path / "cut", "--max-steps", "12", "--resume", *every))[0] == 0
    straight, cut = losses(tmp_path / "straight"), losses(tmp_path / "cut")
    assert sorted(straight) == [4, 8, 12] and sorted(cut) == [4, 7, 8, 12]  # 7: the stopping run's last report
    assert all(cut[step] == straight[step] for step in (4, 8, 12)), (straight, cut)


def test_resume_survives_a_cut_log_line_a_truncated_checkpoint_and_litter(tmp_path, corpus_tsv, straight_run):
    run = tmp_path / "run"
    done = run_cli(*train_argv(corpus_tsv, run, "--max-steps", "30", "--save-every", "10"))
    assert done.returncode == 0, done.stderr
    newest = RunDir(run).checkpoints()[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with open(run / "log.jsonl", "a") as handle:
        handle.write('{"step": 31, "split": "tr')  # the kill came mid-line
    (run / "checkpoints" / ".step_00000040.abc123").mkdir()
    (run / ".log.jsonl.x1y2.tmp").write_text("")
    # `average --out RUN/averaged --force` killed between its renames: the old model, moved aside, is
    # put back as its next writer would, not deleted as litter (found by a fault hunt)
    moved_aside = run / ".averaged.k3j4h5g6.old.tmp" / "averaged"
    moved_aside.mkdir(parents=True)
    (moved_aside / "config.json").write_text("{}")
    again = run_cli(*train_argv(corpus_tsv, run, "--max-steps", "40", "--save-every", "10", "--resume"))
    assert again.returncode == 0, again.stderr
    assert f"skipping unreadable checkpoint {newest}" in again.stdout and "resumed from" in again.stdout
    # set aside: as the newest, every rotation kept it and deleted the run's good ones (found in review)
    assert (newest.parent / f"unreadable-{newest.name}").is_dir()  # and step 30 saved anew, whole:
    assert weights.stat().st_size == (RunDir(run).checkpoints()[-1] / "model.safetensors").stat().st_size
    assert "log.jsonl, line 31 is not a log record" in again.stdout
    assert "left by an interrupted write" in again.stdout
    assert not (run / "checkpoints" / ".step_00000040.abc123").exists() and not (run / ".log.jsonl.x1y2.tmp").exists()
    assert (run / "averaged" / "config.json").read_text() == "{}" and not moved_aside.parent.exists()
    assert log_steps(run) == list(range(1, 41))
    assert losses(run) == {step: loss for step, loss in losses(straight_run).items() if step <= 40}


def test_no_output_replaces_a_file_of_a_training_run(tmp_path, straight_run, capsys):
    """Not with --force either: a run's checkpoints, data, log, configs and records, final and
    averaged models and tokenizer took its training to make. Commands refuse them as outputs,
    whether they read that run (the run, or a model or checkpoint inside it) or another; a new name
    inside the run folder stays allowed, and `average` may make RUN/averaged anew."""
    run = Path(shutil.copytree(straight_run, tmp_path / "run"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    newest = RunDir(run).checkpoints()[-1]
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    translate = ["translate", "--input", tmp_path / "in.txt", "--force", "--output"]
    kept = "which a training run keeps"
    for argv, fragment in ((["average", run, "--last", "2", "--force", "--out", run / "data"], "records a training run keeps"),
                           (["average", run, "--last", "2", "--force", "--out", run / "tokenizer.model"], "records"),
                           (["export-hf", run, run / "checkpoints", "--force"], "records a training run keeps"),
                           (["attention", run, "--sentence", "the cat", "--force", "--out", run / "checkpoints"], "records"),
                           (["translate", run, *translate[1:], run / "log.jsonl"], "records a training run keeps"),
                           (["translate", run / "model", *translate[1:], run / "train_config.json"], "records"),
                           (["translate", newest, *translate[1:], run / "data" / "new.txt"], f"lies inside {run / 'data'}, {kept}")):
        one_line_error(*cli(capsys, *argv)[::2], fragment, "--force replaces outputs, never a run's records")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert cli(capsys, "average", run, "--last", "2", "--out", run / "averaged")[0] == 0
    # Found in review: the averaged model and the demo's figures were open to --force.
    (run / "demo.json").write_text("{}")
    averaged = {p: p.read_bytes() for p in (run / "averaged").iterdir()}
    for argv in (["translate", run, *translate[1:], run / "averaged" / "model.safetensors"],
                 ["translate", run, *translate[1:], run / "demo.json"],
                 ["attention", run, "--sentence", "the cat", "--force", "--out", run / "averaged"]):
        one_line_error(*cli(capsys, *argv)[::2], "choose another output")  # an input (the averaged model read) or kept
    # Found in review: the rule covered only the run a command reads; another run's are kept too.
    other = Path(shutil.copytree(run, tmp_path / "other"))
    hf = tmp_path / "hf"
    assert cli(capsys, "export-hf", run, hf)[0] == 0
    (tmp_path / "pairs.tsv").write_text("the cat\tdie Katze\n", encoding="utf-8")
    for argv in (["translate", run, *translate[1:], other / "demo.json"],
                 ["export-hf", run, other / "averaged", "--force"],
                 ["export-ct2", run, other / "model", "--force"],
                 ["import-hf", hf, other / "averaged", "--force"],
                 ["preprocess", "--corpus", tmp_path / "in.txt", "--out", other / "data", "--force"],
                 ["corpus", "export", tmp_path / "pairs.tsv", "--split", "train", "--out", other / "data", "--force"]):
        one_line_error(*cli(capsys, *argv)[::2], "a training run keeps")
    assert {p.name: p.read_bytes() for p in (other / "averaged").iterdir()} == {p.name: b for p, b in averaged.items()}
    assert (run / "demo.json").read_text() == "{}" and (other / "demo.json").read_text() == "{}"
    assert cli(capsys, "average", run, "--last", "1", "--out", run / "averaged", "--force")[0] == 0  # averaged anew


def test_written_files_have_the_usual_modes(tmp_path, corpus_tsv, capsys):
    old = os.umask(0o022)
    try:
        assert cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--max-steps", "1"))[0] == 0
    finally:
        os.umask(old)
    run = tmp_path / "run"
    for path in [run / "log.jsonl", run / "model" / "model.safetensors", run / "train_config.json",
                 RunDir(run).checkpoints()[-1] / "optimizer.safetensors"]:
        assert path.stat().st_mode & 0o777 == 0o644, path
    for path in [run / "model", RunDir(run).checkpoints()[-1]]:
        assert path.stat().st_mode & 0o777 == 0o755, path


# --- 7. to 9. bad input: one line, exit 2 -----------------------------------------------------

def with_config(model_dir: Path, folder: Path, **changes) -> Path:
    """A copy of the model folder whose config.json has `changes`, as a hand edit would."""
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.model"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_an_empty_tokenizer_a_device_aiayn_does_not_run_on_and_the_version(tmp_path, model_dir, capsys):
    folder = with_config(model_dir, tmp_path / "model")
    (folder / "tokenizer.model").write_bytes(b"")  # SentencePiece would load it, print errors and say 0 tokens
    one_line_error(*cli(capsys, "translate", folder, "--input", tmp_path / "nowhere")[::2], "is empty, not a SentencePiece model")
    for device in ("mps", "meta"):  # names PyTorch knows
        one_line_error(*cli(capsys, "translate", model_dir, "--device", device)[::2],
                       f"aiayn runs on a CPU or a CUDA GPU, not on '{device}'")
    code, out, _ = cli(capsys, "--version")
    assert code == 0 and out.startswith("aiayn 0.") and f"PyTorch {torch.__version__}" in out


def test_exports_refuse_what_their_format_cannot_hold_and_unnamed_languages_saying_why(tmp_path, capsys):
    model = make_model(tmp_path / "pre", norm_first=True)
    one_line_error(*cli(capsys, "export-hf", model, tmp_path / "hf")[::2], "Marian is post-norm", "this model is pre-norm",
                   "--recipe fast", "export-ct2")
    restricted = make_model(tmp_path / "restricted", neighborhood=4)  # CTranslate2 has no restricted attention
    argos = ["export-argos", model, tmp_path / "en_es.argosmodel", "--source-lang", "en", "--target-lang", "es"]
    for argv in (["export-ct2", restricted, tmp_path / "ct2"], ["export-argos", restricted, *argos[2:]]):
        one_line_error(*cli(capsys, *argv)[::2], "cannot export to CTranslate2: it has no restricted self-attention")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pre", "restricted"]
    # A model trained on a TSV without --src-lang/--tgt-lang records its columns' names, not languages.
    (model / "train_config.json").write_text(json.dumps({"src_lang": "src", "tgt_lang": "tgt"}))
    assert languages_of(model) == (None, None)
    (model / "train_config.json").write_text(json.dumps({"src_lang": "de", "tgt_lang": "tgt"}))  # one side given
    assert languages_of(model) == ("de", None)
    one_line_error(*cli(capsys, *argos[:3])[::2], "does not record its languages; give --source-lang and --target-lang")
    (model / "train_config.json").write_text(json.dumps({"src_lang": "en", "tgt_lang": "es"}))
    assert languages_of(model) == ("en", "es")
    # Trained with --data DIR: the languages are in that folder's manifest (were not looked for).
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "manifest.json").write_text(json.dumps({"src_lang": "fr", "tgt_lang": "it"}))
    (model / "train_config.json").write_text(json.dumps({"data": str(tmp_path / "shared")}))
    assert languages_of(model) == ("fr", "it")


def test_a_config_field_of_the_wrong_type(tmp_path, model_dir, capsys):
    folder = with_config(model_dir, tmp_path / "model", dropout="0.1")
    code, _, err = cli(capsys, "translate", folder, "--input", tmp_path / "nowhere")
    one_line_error(code, err, "dropout must be a number, got '0.1'")


def test_weights_that_do_not_fit_their_config_name_the_tensor(tmp_path, model_dir, capsys):
    folder = with_config(model_dir, tmp_path / "model", d_ff=128)
    code, _, err = cli(capsys, "translate", folder, "--input", tmp_path / "nowhere")
    one_line_error(code, err, "does not match its config.json", "feed_forward.w_1.weight has shape [64, 32]",
                   "the config wants [128, 32]")


def test_score_of_empty_files_and_an_unknown_language(tmp_path, capsys):
    (tmp_path / "empty").write_text("")
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "empty", "--hyp", tmp_path / "empty")[::2], "is empty")
    one_line_error(*cli(capsys, "score", "--parse", "--ref", tmp_path / "empty", "--hyp", tmp_path / "empty")[::2],
                   "holds no trees")
    (tmp_path / "one").write_text("a line\n")
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "one", "--hyp", tmp_path / "one", "--lang", "xx")[::2],
                   "--lang xx", "de")
    (tmp_path / "blank").write_text("\n \t\n")  # (found in review: BLEU 0.00, chrF 100.00, exit 0)
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "blank", "--hyp", tmp_path / "blank")[::2],
                   "holds only blank lines: no sentences to score")
    (tmp_path / "five").write_text("la casa es muy pequeña\n")
    code, out, err = cli(capsys, "score", "--ref", tmp_path / "five", "--hyp", tmp_path / "five", "--lang", "es-ES")
    assert code in (0, None) and "paper protocol  100.00  (Moses tokenizer -l es," in out, err  # (found in review: refused)
    (tmp_path / "tree").write_text("(S (NP (DT a) (NN cat)) (VP (VBZ sits)))\n")
    (tmp_path / "open").write_text("(S (NP (DT a) (NN cat)) (VP (VBZ sits))\n")
    one_line_error(*cli(capsys, "score", "--parse", "--ref", tmp_path / "empty", "--hyp", tmp_path / "tree")[::2],
                   "holds no trees")
    one_line_error(*cli(capsys, "score", "--parse", "--ref", tmp_path / "empty", "--hyp", tmp_path / "one")[::2],
                   "holds no trees")  # whatever the hypotheses hold (found in review: their error came first)
    one_line_error(*cli(capsys, "score", "--parse", "--ref", tmp_path / "tree", "--hyp", tmp_path / "open")[::2],
                   f"{tmp_path / 'open'}: ")
    (tmp_path / "linearized").write_text("(S (NP XX XX )NP (VP XX )VP )S\n")  # corpus export's test.tree
    one_line_error(*cli(capsys, "score", "--parse", "--ref", tmp_path / "tree", "--hyp", tmp_path / "linearized")[::2],
                   "holds a word beside other elements; these are linearized trees", "score the trees `aiayn parse` writes")
    for parse in ((), ("--parse",)):  # found in review: "I/O operation on closed file"
        one_line_error(*cli(capsys, "score", *parse, "--ref", "-")[::2], "--ref and --hyp are both stdin")


def test_score_parse_reads_the_hypothesis_trees_from_stdin(tmp_path, capsys, monkeypatch):
    (tmp_path / "tree").write_text("(S (NP (DT a) (NN cat)) (VP (VBZ sits)))\n")
    code, out, err = cli(capsys, "score", "--parse", "--ref", tmp_path / "tree",
                         stdin=(tmp_path / "tree").read_bytes(), monkeypatch=monkeypatch)
    assert code == 0 and "F1 100.00" in out, err


def test_parse_says_when_a_model_looks_like_no_parser(tmp_path, model_dir, capsys, monkeypatch):
    """A translation model's every output was repaired into a flat tree of XX-tagged words, silently.
    A note, not a refusal: the smallest parsing vocabularies have no XX piece either (the toy
    treebank's below about 310 pieces), and their models parse."""
    code, _, err = cli(capsys, "parse", model_dir, "--output", tmp_path / "trees.txt", stdin=b"the cat sat\n",
                       monkeypatch=monkeypatch)
    assert code == 0 and f"aiayn: note: {model_dir} looks like no parsing model: XX" in err
    assert (tmp_path / "trees.txt").read_text(encoding="utf-8").count("(XX ") == 3  # the flat tree it warned of


def test_trees_given_where_sentences_belong_are_refused(tmp_path, model_dir, capsys, monkeypatch):
    """Found by a misuse hunt: `parse` of a treebank decoded its brackets as words (hours of beam 21
    on WSJ §23) and `score` without --parse gave a BLEU of trees, exit 0; a treebank folder of
    dev.mrg and test.mrg alone, to export a split to parse, was "no train.SRC and train.TGT"."""
    trees = "(S (NP (DT the) (NN dog)) (VP (VBD slept)) (. .))\n( (S (NP (PRP it))\n    (VP (VBD ran))))\n"
    (tmp_path / "gold.mrg").write_text(trees)
    for output in (("--output", tmp_path / "out"), ()):
        one_line_error(*cli(capsys, "parse", model_dir, "--input", tmp_path / "gold.mrg", *output)[::2],
                       "gold.mrg holds bracketed trees; parse takes one tokenized sentence a line", "corpus export")
    assert not (tmp_path / "out").exists()
    (tmp_path / "one").write_text(trees.splitlines()[0] + "\n")
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "one", "--hyp", tmp_path / "one")[::2],
                   "hold bracketed trees: score them with --parse")
    (tmp_path / "sentence").write_text("the dog slept .\n")
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "one", "--hyp", tmp_path / "sentence")[::2],
                   f"{tmp_path / 'one'} holds bracketed trees and {tmp_path / 'sentence'} does not")  # one side (found in review)
    one_line_error(*cli(capsys, "score", "--ref", tmp_path / "sentence", "--hyp", tmp_path / "one")[::2],
                   f"{tmp_path / 'one'} holds bracketed trees and {tmp_path / 'sentence'} does not")
    (tmp_path / "said").write_text("(Applause)\n")  # a sentence in brackets is a sentence
    assert cli(capsys, "score", "--ref", tmp_path / "said", "--hyp", tmp_path / "said")[0] == 0
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "test.mrg").write_text(trees)
    one_line_error(*cli(capsys, "corpus", "export", tmp_path / "bank", "--split", "test", "--out", tmp_path / "words")[::2],
                   "holds test.mrg but no train.mrg, which a treebank folder needs", "--split train --out DIR")
    (tmp_path / "bank" / "dev.mrg").write_text(trees)
    one_line_error(*cli(capsys, "corpus", "export", tmp_path / "bank", "--split", "test", "--out", tmp_path / "words")[::2],
                   "holds dev.mrg and test.mrg", f"corpus export {tmp_path / 'bank' / 'test.mrg'} --split train")
    assert cli(capsys, "corpus", "export", tmp_path / "bank" / "test.mrg", "--split", "train", "--out", tmp_path / "words")[0] == 0
    assert (tmp_path / "words" / "train.words").read_text() == "the dog slept .\nit ran\n"


def test_invalid_utf8_on_stdin(model_dir, capsys, monkeypatch):
    code, _, err = cli(capsys, "translate", model_dir, stdin=b"fine\n\xff\xfe\n", monkeypatch=monkeypatch)
    one_line_error(code, err, "stdin, line 2: invalid UTF-8")
    code, _, err = cli(capsys, "score", "--ref", "/dev/null", stdin=b"\xc3\n", monkeypatch=monkeypatch)
    one_line_error(code, err, "stdin, line 1: invalid UTF-8", "iconv -f latin1 -t UTF-8")
    code, _, err = cli(capsys, "translate", model_dir, stdin="fine\n".encode("utf-16"), monkeypatch=monkeypatch)
    one_line_error(code, err, "stdin is UTF-16 (it begins with UTF-16's byte-order mark)", "iconv -f UTF-16 -t UTF-8")
    for order in ("LE", "BE"):  # without the mark (found by a misuse hunt: read as text, NULs and all)
        code, _, err = cli(capsys, "translate", model_dir, stdin="fine\n".encode(f"utf-16-{order}"), monkeypatch=monkeypatch)
        one_line_error(code, err, "stdin looks like UTF-16 without a byte-order mark", f"iconv -f UTF-16{order} -t UTF-8")


@pytest.mark.parametrize("option, value", [("--max-input-tokens", "0"), ("--max-input-tokens", "-2"),
                                           ("--alpha", "-1"), ("--alpha", "100"), ("--beam", "0"), ("--batch-tokens", "0"),
                                           ("--extra-len", "-1"), ("--min-len", "-3"), ("--max-output-len", "0"),
                                           ("--alpha", "inf"), ("--repetition-penalty", "nan")])
def test_decoding_options_out_of_range(model_dir, capsys, option, value):
    one_line_error(*cli(capsys, "translate", model_dir, option, value)[::2], option)


def test_a_decoding_precision_the_device_cannot_run_is_one_line(model_dir, capsys):
    code, _, err = cli(capsys, "translate", model_dir, "--precision", "fp16")
    one_line_error(code, err, "fp16 needs a CUDA GPU")
    assert ("use bf16 or fp32" in err) == fast_bf16(torch.device("cpu"))  # advice this CPU can take
    one_line_error(*cli(capsys, "serve", model_dir, "--precision", "fp16", "--port", "0")[::2], "fp16 needs a CUDA GPU")
    # int8's kernels are CPU ones: the rule holds without a GPU to try it on.
    with pytest.raises(ValueError, match="int8 decoding runs on a CPU"):
        check_precision(torch.device("cuda"), "int8")


def test_tf32_is_refused_on_a_cpu_and_beside_another_precision_in_one_line(corpus_tsv, tmp_path, capsys):
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "a", "--tf32", "true"))[::2],
                   "tf32 is a CUDA GPU's format")
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "b", "--tf32", "true", "--precision", "bf16"))[::2],
                   "tf32 needs precision fp32")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before anything is written


def test_bf16_on_a_cpu_without_hardware_bf16_is_one_line_and_auto_picks_fp32(model_dir, capsys, monkeypatch):
    """On a CPU whose bf16 products PyTorch would emulate (AVX2 only), bf16 is refused in one line
    and `auto` (the demo's and the Table 3 experiment's default) trains and decodes in fp32."""
    import aiayn.device

    monkeypatch.setattr(aiayn.device, "fast_bf16", lambda device: False)
    one_line_error(*cli(capsys, "translate", model_dir, "--precision", "bf16")[::2], "bf16 needs hardware bf16",
                   "use fp32")
    cpu = torch.device("cpu")
    assert aiayn.device.resolve_precision("auto", cpu) == "fp32"
    assert aiayn.device.resolve_precision("bf16", cpu) == "bf16"  # an explicit choice is kept, then checked
    monkeypatch.setattr(aiayn.device, "fast_bf16", lambda device: True)
    assert aiayn.device.resolve_precision("auto", cpu) == "bf16"
    check_precision(cpu, "bf16")


def test_cpu_kind_tells_the_amd_epyc_kinds_apart():
    """Result files and the docs' tables are per CPU kind, and lscpu says "AMD EPYC" for Zen 3, 4
    and 5 alike: the kind comes from /proc/cpuinfo's family and flags (excerpts of the real ones)."""
    from aiayn.device import cpu_kind

    amd = "vendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: fpu avx2 fma{more}\n"
    assert cpu_kind(amd.format(family=25, model=1, more="")) == "amd-epyc-avx2"  # Zen 3
    assert cpu_kind(amd.format(family=25, model=17, more=" avx512f avx512_bf16")) == "amd-epyc"  # Zen 4
    assert cpu_kind(amd.format(family=26, model=2, more=" avx512f avx512_bf16 avx512_vp2intersect")) == "amd-epyc-zen5"
    assert cpu_kind("vendor_id\t: GenuineIntel\ncpu family\t: 6\nflags\t\t: avx512f amx_bf16\n") == "intel-xeon"


def test_import_hf_of_a_bad_folder(tmp_path, model_dir, capsys):
    hf = tmp_path / "hf"
    export_marian(model_dir, hf, echo=lambda _: None)
    config = (hf / "config.json").read_text()
    (hf / "config.json").write_text('{"model_type": "marian"}')
    one_line_error(*cli(capsys, "import-hf", hf, tmp_path / "a")[::2], "config.json lacks d_model")
    for absurd, said in (({"d_model": 10**6, "encoder_ffn_dim": 10**6, "decoder_ffn_dim": 10**6},
                          ("GiB for its weights alone", "available")),
                         ({"vocab_size": 10**12}, ("vocab.json and config.json disagree: the tokenizer has 301 tokens, the model 1000000000000",)),
                         ({"d_model": 30, "encoder_attention_heads": 7, "decoder_attention_heads": 7},
                          ("not supported: d_model 30 is not a multiple of its 7 heads",))):
        (hf / "config.json").write_text(json.dumps({**json.loads(config), **absurd}))
        start = time.monotonic()
        one_line_error(*cli(capsys, "import-hf", hf, tmp_path / "a")[::2], *said)
        assert time.monotonic() - start < 60 and not (tmp_path / "a").exists()  # refused, not allocated
    (hf / "config.json").write_text(config)

    class Payload:  # what a malicious pickle would run on load
        def __reduce__(self):
            return (os.system, ("echo owned",))

    (hf / "model.safetensors").unlink()
    torch.save({"weight": Payload()}, hf / "pytorch_model.bin")
    code, _, err = cli(capsys, "import-hf", hf, tmp_path / "b")
    one_line_error(code, err, "more than tensors", "not loaded")
    assert "weights_only=False" not in err and not (tmp_path / "b").exists()


def test_a_models_special_ids_are_its_tokenizers(tmp_path, model_dir, corpus_tsv, capsys):
    """Found in review: --pad-id 3 trained, and the tokenizer's unknown pieces (3) were masked as padding."""
    one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--pad-id", "3", "--unk-id", "0"))[::2],
                   "--pad-id 3: the tokenizer a run trains has pad 0")
    assert not (tmp_path / "run").exists()
    edited = tmp_path / "edited"
    shutil.copytree(model_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "eos_id": 7}))
    code, _, err = cli(capsys, "translate", edited, "--input", corpus_tsv)
    one_line_error(code, err, "the model's eos_id is 7 but its tokenizer's is 2")


def test_empty_paths_are_refused_and_a_stopped_translate_into_a_run_folder_resumes(tmp_path, straight_run, corpus_tsv,
                                                                                   capsys):
    """Found in review: --corpus "" named the current folder and --init-from "" trained from
    scratch; and once a run's top-level records were guarded, OUTPUT.partial.json inside a run
    folder was taken for one, so a stopped translate there could not resume."""
    for flag in ("--corpus", "--init-from"):
        one_line_error(*cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", flag, ""))[::2], f"{flag} is empty")
    run = Path(shutil.copytree(straight_run, tmp_path / "copy"))
    (tmp_path / "in.txt").write_text("the cat\nthe dog\n", encoding="utf-8")
    (run / "out.txt.partial").write_text("", encoding="utf-8")
    (run / "out.txt.partial.json").write_text("{}", encoding="utf-8")
    code, _, err = cli(capsys, "translate", run, "--input", tmp_path / "in.txt", "--output", run / "out.txt", "--force")
    assert code == 0 and "an input of this command" not in err, err
    assert len((run / "out.txt").read_text(encoding="utf-8").splitlines()) == 2


def test_a_token_budget_below_most_pairs_is_said(tmp_path, corpus_tsv, capsys):
    """Found in review: --max-tokens 1 trained, each pair a batch over the budget, without a word."""
    code, out, err = cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--max-tokens", "2", "--max-steps", "1"))
    assert code == 0, err
    assert "note: 300 of the 300 training pairs are longer than --max-tokens 2: each is a batch of its own" in out
    code, out, err = cli(capsys, *train_argv(corpus_tsv, tmp_path / "other", "--max-steps", "1"))
    assert code == 0 and "training pairs are longer than --max-tokens" not in out


def test_learned_positions_must_hold_the_longest_sentence(tmp_path, corpus_tsv, capsys):
    code, _, err = cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--positional", "learned", "--max-len", "64"))
    one_line_error(code, err, "max_sentence_tokens=256", "max_len is 64")


def test_fp16_on_a_cpu_fails_at_once(tmp_path, corpus_tsv, capsys):
    start = time.perf_counter()
    code, _, err = cli(capsys, *train_argv(corpus_tsv, tmp_path / "run", "--precision", "fp16"))
    one_line_error(code, err, "fp16 needs a CUDA GPU")
    assert time.perf_counter() - start < 10 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("data, lines", [(b"", 0), (b"\n", 1), (b"a\n", 1), (b"a\nb", 2), (b"a\n\n", 2), (b"a\r\nb\r\n", 2)])
def test_an_inputs_lines_are_counted_with_a_last_line_without_a_newline_and_it_is_read_from_its_start(data, lines):
    """The count is the progress bar's total and what a resume checks the partial against (found
    by mutation: a last line without a newline left uncounted passed every test)."""
    handle = io.BytesIO(data)
    assert decode_files._count_lines(handle) == lines and handle.tell() == 0


def test_translate_resume_refuses_every_setting_a_line_depends_on(tmp_path, model_dir, capsys, monkeypatch):
    """Lines decoded with two settings would share one output: each decoding setting, and the
    language paragraphs are split by, is held to the partial's record; a partial cut shorter than
    its record says so (found by mutation: --extra-len and --lang left out of the record, and the
    cut partial called another input, each passed every test)."""
    (tmp_path / "in.txt").write_text("".join(f"{SENTENCES[i % 7]}. {SENTENCES[i % 5]}.\n" for i in range(9)),
                                     encoding="utf-8")
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 3)
    argv = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "2", "--output", tmp_path / "out.txt",
            "--split-sentences", "--lang", "en"]
    real = interrupt_on_chunk(2, monkeypatch)
    assert cli(capsys, *argv)[0] == 130
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    kept = (tmp_path / "out.txt.partial").read_bytes()
    for flag, value, was in [("--extra-len", "7", "50"), ("--min-len", "0", "1"), ("--max-output-len", "5", "None"),
                             ("--no-repeat-ngram-size", "2", "0"), ("--repetition-penalty", "1.5", "1.0"),
                             ("--lang", "de", "en")]:
        one_line_error(*cli(capsys, *argv, flag, value, "--resume")[::2], f"was translated with another {flag} ({was})",
                       "same model and settings")
    assert (tmp_path / "out.txt.partial").read_bytes() == kept
    (tmp_path / "out.txt.partial").write_bytes(kept[: kept.index(b"\n") + 1])  # shorter than its record vouches for
    one_line_error(*cli(capsys, *argv, "--resume")[::2], "holds 1 lines but its record says 3", "--force starts over")


def test_the_languages_of_a_checkpoint_or_model_inside_a_run_are_the_runs_and_of_no_other_model(tmp_path):
    """export-argos of RUN/checkpoints/step_N (or RUN/model) finds the languages RUN recorded
    (found by mutation: the run folder two levels up left out passed every test)."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step_00000002"
    checkpoint.mkdir(parents=True)
    (run / "model").mkdir()
    (run / "train_config.json").write_text(json.dumps({"src_lang": "en", "tgt_lang": "es"}))
    assert languages_of(run / "model") == ("en", "es")
    assert languages_of(checkpoint) == ("en", "es")
    # A model of another tokenizer kept in the run's folder is not the run's (found by an interop
    # hunt: an imported opus-mt-de-fr there was packaged and served as en → es); its own is
    (run / "tokenizer.model").write_bytes(b"the run's")
    (run / "model" / "tokenizer.model").write_bytes(b"the run's")
    (run / "opus-de-fr").mkdir()
    for name in ("source.spm", "target.spm", "vocab.json"):
        (run / "opus-de-fr" / name).write_bytes(b"another")
    assert languages_of(run / "opus-de-fr") == (None, None)
    assert languages_of(run / "model") == languages_of(checkpoint) == ("en", "es")


def test_fine_tuning_may_change_dropout_and_attention_dropout_and_nothing_else(tmp_path, model_dir, corpus_tsv, capsys):
    """--init-from keeps the model's shape, but --dropout and --attention-dropout apply and are
    recorded (found by mutation: both ignored, or --attention-dropout refused, passed every test)."""
    common = ["train", "--init-from", model_dir, "--corpus", corpus_tsv, "--max-steps", "1", "--max-tokens", "300",
              "--device", "cpu", "--eval-every", "1000"]
    code, out, err = cli(capsys, *common, "--out", tmp_path / "tuned", "--dropout", "0.2", "--attention-dropout", "0.1")
    assert code == 0, err
    config = json.loads((tmp_path / "tuned" / "model_config.json").read_text())
    assert (config["dropout"], config["attention_dropout"]) == (0.2, 0.1)
    one_line_error(*cli(capsys, *common, "--out", tmp_path / "other", "--n-heads", "2")[::2],
                   "holds another model shape than --n-heads asks for")


def test_corpus_export_never_replaces_the_corpus_it_reads(tmp_path, capsys):
    """`corpus export DIR --out DIR --force` would write the split over the very files it reads
    (found by mutation: the folder read left out of the inputs passed every test)."""
    corpus = tmp_path / "en-de"
    corpus.mkdir()
    for split in ("train", "test"):
        (corpus / f"{split}.en").write_text("a cat\n\nthe dog\n", encoding="utf-8")
        (corpus / f"{split}.de").write_text("eine Katze\nleer\nder Hund\n", encoding="utf-8")
    before = {path.name: path.read_bytes() for path in corpus.iterdir()}
    code, out, err = cli(capsys, "corpus", "export", corpus, "--split", "test", "--out", corpus, "--force")
    one_line_error(code, err, "an input of this command")
    assert {path.name: path.read_bytes() for path in corpus.iterdir()} == before


def test_a_resumed_run_keeps_its_languages_and_says_a_new_seed_batches_the_epoch_anew(tmp_path, corpus_tsv, capsys):
    """A trained run goes on with the data it began with: --src-lang is not applied (nor recorded);
    another --seed reorders the rest of the epoch, and says so (found by mutation: the languages
    applied and recorded, and no word of the new order, each passed every test)."""
    run = tmp_path / "run"
    assert cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "1", "--src-lang", "en", "--tgt-lang", "es"))[0] == 0
    code, out, err = cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "2", "--resume", "--src-lang", "fr",
                                             "--tgt-lang", "es"))
    assert code == 0, err
    assert "note: --src-lang is not applied" in out
    assert json.loads((run / "train_config.json").read_text())["src_lang"] == "en"
    code, out, err = cli(capsys, *train_argv(corpus_tsv, run, "--max-steps", "3", "--resume", "--seed", "4"))
    assert code == 0 and "--seed 3 → 4" in out and "the rest of this epoch is batched anew" in out, err


def test_a_new_start_over_a_failed_starts_configs_takes_the_options_given(tmp_path, corpus_tsv, capsys):
    """Without --resume, configs an earlier failed start left are replaced, not resumed (found by
    mutation: resuming them passed every test)."""
    import dataclasses

    from aiayn.config import PRESETS, TrainConfig
    from aiayn.run import RunDir

    run = RunDir(tmp_path / "run")
    with run.lock():
        run.write_configs(dataclasses.replace(PRESETS["tiny"], d_model=64, vocab_size=300), TrainConfig(max_steps=9))
    code, out, err = cli(capsys, *train_argv(corpus_tsv, run.path, "--max-steps", "1"))
    assert code == 0, err
    assert json.loads((run.path / "model_config.json").read_text())["d_model"] == 32
    assert json.loads((run.path / "train_config.json").read_text())["max_steps"] == 1


def test_a_checkpoint_without_its_tokenizer_translates_with_the_runs(tmp_path, model_dir, capsys):
    """A run folder whose newest checkpoint holds no tokenizer: the run folder's is used
    (pinned_model_dir; found by mutation: "no tokenizer at .../step_N" passed every test)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "checkpoints" / "step_00000002")
    (run / "checkpoints" / "step_00000002" / "tokenizer.model").unlink()
    shutil.copy(model_dir / "tokenizer.model", run / "tokenizer.model")
    (tmp_path / "in.txt").write_text("the cat\n", encoding="utf-8")
    code, out, err = cli(capsys, "translate", run, "--input", tmp_path / "in.txt", "--beam", "1")
    assert code in (0, None), err
    assert len(out.splitlines()) == 1


def test_a_resumed_demo_trains_to_its_new_budget(tmp_path, monkeypatch):
    """`aiayn demo --minutes 30` on a run begun with --minutes 10 goes on until 30, the new budget
    (found by mutation: the old budget kept passed every test)."""
    import pytest

    import aiayn.demo
    from aiayn.config import DEMO_RECIPE, DecodeConfig, DemoOptions, TrainConfig, demo_model
    from aiayn.run import RunDir

    run = RunDir(tmp_path / "demo")
    run.write_configs(demo_model("tiny"), TrainConfig(corpus=DEMO_RECIPE["corpus"], minutes=10.0))
    seen = []

    class Stop(Exception):
        pass

    def train_run(model_config, training, *args, **kwargs):
        seen.append(training)
        raise Stop

    monkeypatch.setattr(aiayn.demo, "train_run", train_run)
    with pytest.raises(Stop):
        aiayn.demo.run_demo(DemoOptions(out=str(run.path), minutes=30.0, preset="tiny"), DecodeConfig())
    assert seen[0].minutes == 30.0


def test_a_world_size_over_one_joins_a_group_without_torchrun_too(monkeypatch):
    """WORLD_SIZE set by hand or by a scheduler: each process joins the group rather than train
    alone (found by mutation: a group joined only past 2 processes passed every test)."""
    import torch.distributed as dist

    from aiayn import device

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(device, "_stop_with_launcher", lambda: None)
    monkeypatch.setattr(device, "process_group_joined", lambda: False)
    joined = []

    def join(backend):
        joined.append(backend)
        raise RuntimeError("joined")

    monkeypatch.setattr(dist, "init_process_group", join)
    for size in ("2", "3"):
        monkeypatch.setenv("WORLD_SIZE", size)
        with pytest.raises(RuntimeError, match="joined"):
            device.init_distributed("cpu")
    assert joined == ["gloo", "gloo"]
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert device.init_distributed("cpu") == (0, 1)


def test_a_device_is_named_exactly_and_the_peak_counts_two_flops_a_multiply_add(monkeypatch):
    """"CPU" or " cpu" is no device name PyTorch knows; an n×n product is 2n³ FLOPs, as
    aiayn.flops counts them (found by mutation: names parsed loosely, and n³, which doubles every
    reported share of the peak, each passed every test)."""
    import time

    from aiayn import device

    assert device.resolve_device("cpu") == torch.device("cpu")
    for wrong in ("CPU", " cpu", "cpu ", "gpu", "cuda:x", ""):
        with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
            device.resolve_device(wrong)
    ticks = iter(range(100))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    ones = torch.ones(4, 4)
    assert device._flops_of(torch.matmul, ones, ones, torch.device("cpu"), 0.5) == 2 * 4 ** 3


def test_averaging_sums_in_float64(tmp_path):
    """1 + 2^-24 + 2^-24 is 1 in float32 sums, one unit in the last place off the mean that float64
    sums round to (found by mutation: float32 sums passed every test)."""
    from aiayn.run import average_checkpoints

    folders = [make_model(tmp_path / "m0")] + [Path(shutil.copytree(tmp_path / "m0", tmp_path / f"m{i}")) for i in (1, 2)]
    for folder, value in zip(folders, (1.0, 2.0 ** -24, 2.0 ** -24)):
        model = Transformer.load(folder)
        with torch.no_grad():
            next(model.parameters()).fill_(value)
        model.save(folder, force=True)
    average_checkpoints(folders, tmp_path / "avg")
    averaged = next(Transformer.load(tmp_path / "avg").parameters())
    assert torch.all(averaged == torch.tensor((1 + 2.0 ** -23) / 3, dtype=torch.float32))


def test_a_partial_is_resumed_only_under_the_stop_rule_it_was_made_with(tmp_path, model_dir, capsys, monkeypatch):
    """Found in review: --stop is in the record; a record from before it was kept was made with
    the beams rule, so --stop bound does not resume it."""
    import json

    (tmp_path / "in.txt").write_text("\n".join(SENTENCES[:9]) + "\n", encoding="utf-8")
    argv = ["translate", model_dir, "--input", tmp_path / "in.txt", "--beam", "2", "--output", tmp_path / "out.txt"]
    monkeypatch.setattr(decode_files, "CHUNK_LINES", 3)
    real = interrupt_on_chunk(2, monkeypatch)
    assert cli(capsys, *argv, "--stop", "bound")[0] == 130
    record = tmp_path / "out.txt.partial.json"
    assert json.loads(record.read_text())["--stop"] == "bound"
    one_line_error(*cli(capsys, *argv, "--resume")[::2], "--stop (bound)")
    kept = json.loads(record.read_text())
    del kept["--stop"]
    record.write_text(json.dumps(kept))
    one_line_error(*cli(capsys, *argv, "--resume", "--stop", "bound")[::2], "--stop (beams)")
    monkeypatch.setattr(translate_module, "translate_nbest", real)
    assert cli(capsys, *argv, "--resume")[0] == 0
