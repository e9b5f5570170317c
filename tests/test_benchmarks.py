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
