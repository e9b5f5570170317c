"""§6.3 end to end: train a tiny parser on the toy treebank, parse, score with EVALB's rules.
The commands run in this process (tests/test_faults.py's `cli`): a process of each would
import PyTorch anew, a few seconds every time."""

import re
from pathlib import Path

import aiayn
from aiayn.parsing import delinearize, evalb, read_trees, tree_to_string
from test_faults import cli

TREEBANK = Path(aiayn.__file__).parent / "corpora" / "toy-treebank.mrg"


def test_train_a_tiny_parser_then_parse_and_score(tmp_path, capsys):
    run = tmp_path / "parser"
    code, _, err = cli(capsys, "train", "--preset", "tiny", "--vocab-size", "360", "--corpus", TREEBANK, "--out", run,
                       "--max-steps", "400", "--log-every", "100", "--max-tokens", "1500", "--warmup-steps", "100",
                       "--lr-scale", "0.5", "--label-smoothing", "0", "--dropout", "0", "--save-every", "400",
                       "--precision", "fp32",
                       "--device", "cpu")
    assert code == 0, err[-2000:]
    trees = read_trees(TREEBANK.read_text(encoding="utf-8"))[:30]
    (tmp_path / "sentences.txt").write_text("".join(" ".join(t.words()) + "\n" for t in trees) + "\n", encoding="utf-8")
    (tmp_path / "gold.mrg").write_text("".join(tree_to_string(t) + "\n" for t in trees), encoding="utf-8")
    code, _, err = cli(capsys, "parse", run, "--input", tmp_path / "sentences.txt", "--output", tmp_path / "test.txt",
                       "--beam", "4")
    assert code == 0 and "looks like no parsing model" not in err, err[-2000:]
    lines = (tmp_path / "test.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-2:] == ["", ""]  # the empty input line gives an empty output line
    outputs = read_trees("\n".join(lines))
    # Whatever the model emits, each output is a valid tree over exactly the input words.
    assert [t.words() for t in outputs] == [t.words() for t in trees]
    (tmp_path / "test.mrg").write_text("".join(tree_to_string(t) + "\n" for t in outputs), encoding="utf-8")
    code, out, err = cli(capsys, "score", "--parse", "--ref", tmp_path / "gold.mrg", "--hyp", tmp_path / "test.mrg")
    assert code == 0, err
    f1 = float(re.search(r"F1 ([\d.]+)", out).group(1))
    # A model that learned nothing is repaired into flat trees, (S w1 ... wn): every parse must beat
    # that by a margin. fp32 above, so that every CPU kind trains in the same precision (auto is
    # bf16 on one and fp32 on another); 400 steps gave F1 58 against the flat trees' 20 on an AMD EPYC.
    flat = evalb(trees, [delinearize([], t.words()) for t in trees])["f1"]
    assert f1 >= flat + 10, (out, flat)
