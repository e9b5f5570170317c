"""Run folders written by earlier versions keep working: a run made by aiayn at commit c08bdea
(before the application layer was reorganised: tests/fixtures/run-c08bdea.tar.xz, a tiny model
trained 12 steps on a toy corpus, with its checkpoints, data/, model/ and averaged/) loads,
resumes, translates and averages with today's code."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "run-c08bdea.tar.xz"


@pytest.fixture
def old_run(tmp_path, monkeypatch):
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    monkeypatch.chdir(tmp_path)  # the run recorded its corpus as toy.tsv, relative to where it ran
    return tmp_path / "run"


def aiayn(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "aiayn", *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_an_old_run_resumes_where_it_stopped(old_run):
    done = aiayn("train", "--out", str(old_run), "--resume", "--max-steps", "14", cwd=old_run.parent)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout + done.stderr and "step_00000012" in done.stdout + done.stderr
    steps = [json.loads(line)["step"] for line in (old_run / "log.jsonl").read_text().splitlines()]
    assert max(steps) == 14 and steps.count(13) == 1
    assert (old_run / "checkpoints" / "step_00000014" / "model.safetensors").is_file()


@pytest.mark.parametrize("folder", ["run", "run/model", "run/averaged", "run/checkpoints/step_00000010"])
def test_an_old_run_translates_from_every_folder_it_holds(old_run, folder):
    path = old_run.parent / folder
    done = subprocess.run([sys.executable, "-m", "aiayn", "translate", str(path), "--beam", "2"],
                          input="god created light\n\nwater\n", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_an_old_run_averages_and_loads_in_python(old_run):
    done = aiayn("average", str(old_run), "--last", "2", "--out", str(old_run.parent / "avg"))
    assert done.returncode == 0, done.stderr
    from aiayn.model import Transformer

    averaged = Transformer.load(old_run.parent / "avg")
    kept = Transformer.load(old_run / "averaged")  # the same two checkpoints, averaged by the old code
    for (name, a), (_, b) in zip(averaged.state_dict().items(), kept.state_dict().items()):
        assert a.equal(b), name
