"""The benchmark scripts' own mistakes of use: like aiayn's commands, a missing input is one line
and a non-zero exit, not a traceback (found in review: three of them raised FileNotFoundError)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("script", ["compiled_step", "decode_steps", "int8_quality", "libretranslate_load",
                                    "sentence_split", "serve_load", "serve_rss", "store_formats"])
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
