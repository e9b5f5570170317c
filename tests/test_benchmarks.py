"""The benchmark scripts' own mistakes of use: like aiayn's commands, a missing input is one line
and a non-zero exit, not a traceback (found in review: three of them raised FileNotFoundError)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("script", ["compiled_step", "decode_steps", "int8_quality", "libretranslate_load",
                                    "sentence_split", "serve_load", "serve_rss", "stop_rule", "store_formats"])
def test_a_benchmark_given_a_missing_folder_exits_in_one_line(script, tmp_path):
    missing = tmp_path / "no-such-run"
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not missing.exists()


def run_script(script: str, *argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *map(str, argv)],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("script, argv", [("speed", ["--reps", "0"]), ("decode_kernels", ["--calls", "-1"]),
                                          ("sweep", ["--threads", "0"]), ("padding", ["--budgets", "2000", "x"]),
                                          ("serve_load", ["--seconds", "nan"]), ("decode_steps", ["x", "--beside", "-1"])])
def test_counts_that_are_no_counts_are_refused_before_any_work(script, argv):
    """Found in review: --reps 0 measured nothing and wrote a file of empty results with exit 0,
    --threads 0 and --calls -1 were tracebacks."""
    done = run_script(script, *argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "give a whole number of at least" in done.stderr or "give a number above 0" in done.stderr


def test_an_existing_out_is_replaced_only_with_force_and_checked_before_any_work(tmp_path):
    """Found in review: --out was replaced without a word, and one that could not be written
    failed with a traceback at the end of the run."""
    out = tmp_path / "mine.json"
    out.write_text("my results\n")
    done = run_script("padding", "--budgets", "2000", "--out", out)
    assert done.returncode != 0 and "already exists" in done.stderr and "--force" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and out.read_text() == "my results\n"
    done = run_script("padding", "--budgets", "2000", "--out", tmp_path)
    assert done.returncode != 0 and "is a folder" in done.stderr and "Traceback" not in done.stderr
    done = run_script("padding", "--budgets", "2000", "--out", out, "--force")
    assert done.returncode == 0, done.stderr
    assert '"benchmark": "padding"' in out.read_text() and not list(tmp_path.glob("*.partial")) + list(tmp_path.glob(".*"))


def test_report_names_a_results_file_it_was_given_that_does_not_exist(tmp_path):
    done = run_script("report", "--speed", tmp_path / "speed-typo.json", "--out", tmp_path / "b.md")
    assert done.returncode == 2 and "no such file: --speed" in done.stderr and not (tmp_path / "b.md").exists()


def test_the_peak_is_measured_on_the_work_s_threads_and_a_share_divides_by_its_highest(monkeypatch):
    """Found in review: a results file of --threads 1 kept the peak of every core (measured first,
    and cached for the process whatever the thread count), and a share of the median of the peak's
    repetitions put aiayn at 113% of a peak that spread 0.12 to 0.18 TFLOP/s."""
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import common
    from aiayn import device

    measured = []
    monkeypatch.setattr(device, "_flops_of", lambda *args: measured.append(torch.get_num_threads()) or 1e9)
    monkeypatch.setattr(common, "matmul_peak_flops", device.matmul_peak_flops)
    before = torch.get_num_threads()
    device._matmul_peak_flops.cache_clear()  # measured anew, and the fake figures forgotten after
    try:
        record = common.machine(torch.device("cpu"), 1)
        assert record["peak_threads"] == 1 and set(measured) == {1} and torch.get_num_threads() == before
        if before > 1:  # another thread count is measured anew, not served from the first
            measured.clear()
            common.machine(torch.device("cpu"), before)
            assert measured and set(measured) == {before}
    finally:
        device._matmul_peak_flops.cache_clear()
    assert common.peak_share({"median": 0.142}, {"median": 0.126, "min": 0.116, "max": 0.176}) == pytest.approx(0.142 / 0.176)


def test_a_stopped_benchmark_stops_the_trainings_it_started_in_sessions_of_their_own(tmp_path):
    """Found in review: `timeout` on learning_curve.py ended it and left its `aiayn train`
    children (sessions of their own, started from worker threads) training on."""
    import os
    import signal
    import time

    script = tmp_path / "bench.py"
    script.write_text(f"""
import os, sys, threading, time
sys.path.insert(0, {str(BENCHMARKS)!r})
from peers.harness import run_for, stop_children_on_signals
stop_children_on_signals()
worker = threading.Thread(target=run_for, args=(["sleep", "60"], 5, {str(tmp_path / 'log')!r}, dict(os.environ)), daemon=True)
worker.start()
time.sleep(60)
""")
    bench = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (children := [p for p in Path("/proc").iterdir() if p.name.isdigit()
                                                                and _parent(p) == bench.pid]):
            time.sleep(0.05)
        assert children, "the benchmark started no child"
        os.kill(bench.pid, signal.SIGTERM)
        assert bench.wait(30) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(child.exists() and _state(child) != "Z" for child in children):
            time.sleep(0.05)
        assert not [child for child in children if child.exists() and _state(child) != "Z"]
    finally:
        bench.kill()


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _state(proc: Path) -> str:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_decode_steps_measures_a_model_end_to_end(tiny_run, tmp_path):
    """Found in session: a review's change named a local `decode` after the script's own function,
    and every run of decode_steps.py failed at its warm-up with a TypeError."""
    import json

    out = tmp_path / "steps.json"
    done = run_script("decode_steps", tiny_run, "--precision", "fp32", "--sentences", "3", "--live", "2",
                      "--reps", "1", "--threads", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["step_ms_1"]["median"] > 0 and summary["step_ms_2"]["median"] > 0 and summary["ceiling"]["median"] > 0


def test_train_memory_writes_its_results_beside_its_out_not_over_the_repository_s(monkeypatch):
    """Found in review: with --out the PNG went there and the JSON over the committed
    results/train-memory-KIND.json. (Running it trains two demo models: 20 s.)"""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import RESULTS, cpu_kind
    from train_memory import results_file

    assert results_file(Path("/tmp/x/memory.png")) == Path("/tmp/x/memory.json")
    assert results_file(None) == RESULTS / f"train-memory-{cpu_kind()}.json"


def test_the_gpu_session_script_runs_tests_scripts_and_flags_that_exist():
    """benchmarks/gpu_session.sh runs on a GPU lent for minutes, seldom: a test renamed or a flag
    dropped since it last ran would cost that machine's time. It parses, every test it names is
    in tests/test_cuda.py, and every benchmark it calls exists and defines each flag it is given."""
    script = BENCHMARKS / "gpu_session.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    cuda_tests = (BENCHMARKS.parent / "tests" / "test_cuda.py").read_text()
    named = re.findall(r"tests/test_cuda\.py::(\w+)", text)
    assert named and all(f"def {name}(" in cuda_tests for name in named)
    calls = [(name, re.findall(r"\s(--[a-z][a-z-]*)", case)) for case in text.split('case "$what" in')[1].split(";;")
             for name in re.findall(r"benchmarks/(\w+)\.py", case)]  # each part of the `case` one call
    assert {name for name, _ in calls} >= {"speed", "profile_train", "decode_mix", "profile_decode"}
    for name, flags in calls:
        source = (BENCHMARKS / f"{name}.py").read_text()
        assert flags and all(f'"{flag}"' in source for flag in flags), (name, [f for f in flags if f'"{f}"' not in source])


def test_report_says_how_to_repeat_a_result_whose_script_defaults_moved_since(tmp_path):
    """Found in a docs audit: docs/benchmarks.md gave `python benchmarks/speed.py` as recorded,
    whose defaults now add real batch shapes (hours on a CPU) to the fixed batches it measured."""
    results = BENCHMARKS / "results"
    for name, today in (("speed-cpu.json", True), ("speed-train-amd-epyc-zen5.json", False)):
        done = run_script("report", "--speed", results / name, "--no-sweep", "--out", tmp_path / "b.md", "--force")
        assert done.returncode == 0, done.stderr
        text = (tmp_path / "b.md").read_text()
        assert ("today the same cases: python benchmarks/speed.py --batches fixed" in text) == today, text[:600]


def test_recorded_command_adds_the_flags_only_to_a_speed_result_from_before_batches():
    """Each condition of report.recorded_command (found by mutation: dropping any one passed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report", BENCHMARKS / "report.py")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(report)
    finally:
        sys.path.remove(str(BENCHMARKS))
    old = {"benchmark": "speed", "command": "python benchmarks/speed.py", "settings": {}}
    assert len(report.recorded_command(old)) == 2
    for result in ({**old, "command": "python benchmarks/speed.py --batches fixed"},
                   {**old, "settings": {"budgets": []}}, {**old, "benchmark": "sweep"}):
        assert report.recorded_command(result) == [result["command"]]


def test_force_replaces_a_scripts_own_runs_folder_only(tmp_path, monkeypatch):
    """Found by a misuse hunt: train_memory.py and quality_per_hour.py --force deleted whatever
    --runs named: a training run, or the current folder."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import replace_runs_folder

    theirs = tmp_path / "work"
    theirs.mkdir()
    (theirs / "data.txt").write_text("mine\n")
    (theirs / "bounded").mkdir()
    with pytest.raises(SystemExit, match="not the folder of an earlier call's runs .it holds data.txt"):
        replace_runs_folder(theirs, True, lambda name: name == "bounded")
    assert (theirs / "data.txt").read_text() == "mine\n"
    monkeypatch.chdir(theirs / "bounded")
    with pytest.raises(SystemExit, match="choose another --runs"):
        replace_runs_folder(theirs, True, lambda name: True)  # a folder above the current one
    with pytest.raises(SystemExit, match="pass --force"):
        replace_runs_folder(theirs, False, lambda name: True)
    monkeypatch.chdir(tmp_path)
    replace_runs_folder(theirs, True, lambda name: True)
    assert not theirs.exists()


def test_out_never_replaces_what_the_script_reads_nor_a_file_of_the_repository(tmp_path):
    """Found by a misuse hunt: int8_quality.py RUN --out RUN/model.safetensors --force wrote JSON
    over the model; --out Makefile replaced it without --force, as git held it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.safetensors").write_bytes(b"weights")
    done = run_script("int8_quality", run, "--out", run / "model.safetensors", "--force")
    assert done.returncode != 0 and "lies inside" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert (run / "model.safetensors").read_bytes() == b"weights"
    makefile = BENCHMARKS.parent / "Makefile"
    before = makefile.read_bytes()
    done = run_script("padding", "--budgets", "2000", "--out", makefile)
    assert done.returncode != 0 and "already exists" in done.stderr and makefile.read_bytes() == before
