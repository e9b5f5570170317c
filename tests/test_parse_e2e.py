"""§6.3 end to end: train a tiny parser on the toy treebank, parse, score with EVALB's rules."""

import re
import subprocess
import sys
from pathlib import Path

import aiayn
from aiayn.parsing import read_trees, tree_to_string

TREEBANK = Path(aiayn.__file__).parent / "corpora" / "toy-treebank.mrg"


def aiayn_cli(*argv):
    return subprocess.run([sys.executable, "-m", "aiayn", *map(str, argv)], capture_output=True, text=True, timeout=300)


def test_train_a_tiny_parser_then_parse_and_score(tmp_path):
    run = tmp_path / "parser"
    trained = aiayn_cli("train", "--preset", "tiny", "--vocab-size", "360", "--corpus", TREEBANK, "--out", run,
                        "--max-steps", "400", "--log-every", "100", "--max-tokens", "1500", "--warmup-steps", "100",
                        "--lr-scale", "0.5", "--label-smoothing", "0", "--dropout", "0", "--save-every", "400",
                        "--device", "cpu")
    assert trained.returncode == 0, trained.stderr[-2000:]
    trees = read_trees(TREEBANK.read_text(encoding="utf-8"))[:30]
    (tmp_path / "sentences.txt").write_text("".join(" ".join(t.words()) + "\n" for t in trees) + "\n", encoding="utf-8")
    (tmp_path / "gold.mrg").write_text("".join(tree_to_string(t) + "\n" for t in trees), encoding="utf-8")
    parsed = aiayn_cli("parse", run, "--input", tmp_path / "sentences.txt", "--output", tmp_path / "test.txt", "--beam", "4")
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    lines = (tmp_path / "test.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-2:] == ["", ""]  # the empty input line gives an empty output line
    outputs = read_trees("\n".join(lines))
    # Whatever the model emits, each output is a valid tree over exactly the input words.
    assert [t.words() for t in outputs] == [t.words() for t in trees]
    (tmp_path / "test.mrg").write_text("".join(tree_to_string(t) + "\n" for t in outputs), encoding="utf-8")
    scored = aiayn_cli("score", "--parse", "--ref", tmp_path / "gold.mrg", "--hyp", tmp_path / "test.mrg")
    assert scored.returncode == 0, scored.stderr
    f1 = float(re.search(r"F1 ([\d.]+)", scored.stdout).group(1))
    assert f1 >= 25, scored.stdout  # 400 steps learn much of the toy grammar (about 39 when written)
