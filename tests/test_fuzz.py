"""Fuzz tests: random bytes and random Unicode into every reader of user input.

The readers are the corpus loaders (aiayn.corpora), the line readers of `aiayn translate` and
`aiayn score` (files and stdin), and the config loaders (aiayn.checkpoint.read_config,
aiayn.run.RunDir.configs, `aiayn translate RUN` with a fuzzed RUN/model/config.json).

The only outcomes allowed are a result, or a user error:

* from the CLI (`aiayn.cli.main`, run in-process so that an example costs milliseconds): a
  non-zero exit whose stderr ends with one line `aiayn: error: ...` (only `aiayn: note: ...`
  lines may come before it);
* from the Python API: a ValueError or an OSError (FileNotFoundError is one) whose message is
  one line -- the exceptions `aiayn.cli.main` turns into `aiayn: error: ...`.

Anything else (a traceback) is a failure. Where a property is cheap it is checked as well, above
all that a file of N lines (split on "\\n" only, as `wc -l` counts them; a last line without
"\\n" counts too) gives N sentences or N output lines, whatever \\r, \\x0c, \\x1c-\\x1e, \\x85,
U+2028 or U+2029 the lines hold. Examples are derandomized, so every run (and CI) tries the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from aiayn import cli
from aiayn.checkpoint import CONFIG, WEIGHTS, read_config
from aiayn.tokenizer import MODEL_FILE as TOKENIZER
from aiayn.config import ModelConfig, TrainConfig
from aiayn.corpora import ParallelCorpus, load_corpus
from aiayn.lines import read_lines, tsv_pairs
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer
from aiayn.run import MODEL_CONFIG, TRAIN_CONFIG, RunDir

FUZZ = settings(
    derandomize=True,  # the same examples on every run: reproducible in CI
    database=None,  # nothing written into the working tree
    deadline=None,
    print_blob=False,
    max_examples=50,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no database to reuse; no slow explain phase
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# --------------------------------------------------------------------------------------------
# Strategies

# Everything str.splitlines() splits on (and "\n" alone is a line break for wc -l and for us).
SEPARATORS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
ODD = ["\t", " ", "  ", "\u3000", "\ufeff", "\x00", "\u200b", "🐈", "猫", "ölçü", "e\u0301", "\U0010ffff"]
WORDS = ["the", "small", "cat", "sees", "a", "big", "dog", "la", "casa", "perro", "-", "\"", "."]
INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80"]

pieces = st.one_of(st.sampled_from(SEPARATORS), st.sampled_from(ODD), st.sampled_from(WORDS), st.text(max_size=6))
fuzz_text = st.lists(pieces, max_size=20).map("".join)
byte_pieces = st.one_of(
    fuzz_text.map(lambda text: text.encode("utf-8")), st.sampled_from(INVALID_UTF8), st.binary(max_size=6)
)
fuzz_bytes = st.one_of(st.binary(max_size=120), st.lists(byte_pieces, max_size=10).map(b"".join))
# One line of text: anything but "\n" (a sentence may hold every other separator).
line_text = st.lists(pieces, max_size=8).map(lambda parts: "".join(parts).replace("\n", " "))


@st.composite
def line_files(draw, n_lines=None) -> bytes:
    """A text file of whole lines (any of them blank), or fuzz bytes."""
    if n_lines is None and draw(st.booleans()):
        return draw(fuzz_bytes)
    count = draw(st.integers(0, 6)) if n_lines is None else n_lines
    lines = draw(st.lists(line_text, min_size=count, max_size=count))
    data = "".join(line + draw(st.sampled_from(["\n", "\r\n"])) for line in lines)
    if lines and draw(st.booleans()):
        data = data.rstrip("\n")  # no line break after the last line
    return data.encode("utf-8")


tree_tokens = st.sampled_from(["(", ")", " ", "\n", "(S", "(NP", "(VP", "(NN", "(DT", "(-NONE-", "*T*-1", "NP-SBJ-1",
                               "PP-LOC=2", "(TOP", "(ROOT", "(-LRB-", "(.", "the", "dog", "barks", "( ", "\t",
                               "\x85", "\u2028", "\r"])
tree_text = st.one_of(
    st.lists(st.one_of(tree_tokens, st.text(max_size=3)), max_size=30).map("".join),
    st.lists(st.sampled_from(["(S (NP (DT the) (NN dog)) (VP (VBZ barks)) (. .))", "( (S (NP-SBJ (NN x)) (VP (VB y))) )",
                              "(S (NP (-NONE- *)) (VP (VB go)))", "\n"]), max_size=4).map("\n".join),
)
tree_bytes = st.one_of(tree_text.map(lambda text: text.encode("utf-8")), fuzz_bytes)
DEEP_TREE = ("(S " * 3000 + "(NN a)" + ")" * 3000 + "\n").encode()  # deeper than Python's recursion limit

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.sampled_from(["0.1", "1", "relu", ""])
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)),
    max_leaves=6,
)
# For configs that build a model: no size field so large that building it takes long.
small_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.floats(), st.text(max_size=8),
    st.sampled_from(["0.1", "1", "32", "relu", "gelu", "learned", "sinusoidal_concat", ""]),
)
small_json_values = st.one_of(
    small_json_scalars, st.lists(json_scalars, max_size=3), st.dictionaries(st.text(max_size=4), json_scalars, max_size=2)
)


@st.composite
def config_files(draw, valid: dict, values=json_values) -> bytes:
    """config.json text: bytes, any JSON value, or `valid` with fields changed, removed or added."""
    kind = draw(st.sampled_from(["bytes", "json", "changed", "changed", "changed"]))
    if kind == "bytes":
        return draw(fuzz_bytes)
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    config = dict(valid)
    for name in draw(st.lists(st.sampled_from(list(valid)), max_size=2)):
        config.pop(name, None)
    config.update(draw(st.dictionaries(st.sampled_from(list(valid)), values, max_size=3)))
    config.update(draw(st.dictionaries(st.text(max_size=6), json_scalars, max_size=1)))
    return json.dumps(config, ensure_ascii=draw(st.booleans())).encode()


# --------------------------------------------------------------------------------------------
# Helpers


def count_lines(data: bytes) -> int:
    """Lines as `wc -l` counts them (split on "\\n" only), plus a last line without "\\n"."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_api_error(error: BaseException) -> None:
    """An exception from the API must be one the CLI reports as `aiayn: error:`, in one line."""
    if not isinstance(error, (ValueError, OSError)):
        raise error
    message = str(error)
    assert message.strip(), f"{type(error).__name__} with an empty message"
    assert "\n" not in message, f"{type(error).__name__} message is not one line: {message!r}"


def api(call):
    """call() or, for a user error, the exception (checked by check_api_error)."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - anything but a one-line user error re-raises
        check_api_error(error)
        return error


def run_cli(argv: list[str], stdin: bytes = b"", errors: str = "strict") -> tuple[int, bytes, str]:
    """(exit status, stdout bytes, stderr) of `aiayn ARGV` run in-process.

    stdin and stdout are text streams over bytes as Python makes them: UTF-8 with `errors`
    ("strict" under a UTF-8 locale such as en_US.UTF-8; "surrogateescape" under C.UTF-8, POSIX
    or PYTHONUTF8=1), no newline translation."""
    stdin_stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors=errors, newline="\n")
    out_bytes = io.BytesIO()
    stdout_stream = io.TextIOWrapper(out_bytes, encoding="utf-8", errors=errors, newline="\n")
    stderr_stream = io.StringIO()
    with mock.patch.object(sys, "stdin", stdin_stream), contextlib.redirect_stdout(stdout_stream), \
            contextlib.redirect_stderr(stderr_stream):
        try:
            status = cli.main(argv)
        except SystemExit as done:
            status = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
    stdout_stream.flush()
    return status, out_bytes.getvalue(), stderr_stream.getvalue()


def check_cli_outcome(status: int, stderr: str) -> None:
    """Success, or a non-zero exit with one `aiayn: error: ...` line last on stderr."""
    lines = stderr.split("\n")
    assert lines[-1] == "", f"stderr does not end with a line break: {stderr!r}"
    *notes, last = lines[:-1] or [""]
    if status == 0:
        notes = lines[:-1]
    else:
        assert last.startswith("aiayn: error: "), f"exit {status} without a one-line aiayn: error: {stderr!r}"
    assert all(note.startswith("aiayn: note: ") for note in notes), f"unexpected stderr: {stderr!r}"


@contextlib.contextmanager
def scratch(base: Path):
    """A fresh folder for one example."""
    folder = Path(tempfile.mkdtemp(dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


SENTENCES = [
    f"{a} {b} {c}"
    for a in ("the small cat", "a big dog", "la casa", "el perro", "a red bird")
    for b in ("sees", "eats", "come", "ve", "likes")
    for c in ("the river", "the fish.", "el río", "los niños", "a bridge", "\"yes\"", "12 - 3")
]  # 175 short sentences


MODEL = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, max_len=64, final_logits_bias=True)


def make_model(folder: Path, tokenizer: Tokenizer, favourite: int) -> Path:
    """A tiny random model whose logits bias makes greedy search pick `favourite` at every step."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=tokenizer.vocab_size, **MODEL))
    with torch.no_grad():
        model.logits_bias[favourite] = 1e4
    model.save(folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models decode fastest on one thread, and a busy 2-core machine does not stall them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(SENTENCES, 300, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A model folder with a real tokenizer and a model that ends every sentence at once (EOS first),
    so an example costs one decoding step: what is fuzzed is the way in and out, not the model."""
    return make_model(tmp_path_factory.mktemp("model"), tokenizer, tokenizer.eos_id)


def translate_argv(model: Path) -> list[str]:
    return ["translate", str(model), "--beam", "1", "--max-input-tokens", "8", "--device", "cpu"]


# --------------------------------------------------------------------------------------------
# (1) Corpus readers


def check_corpus(corpus: ParallelCorpus, lines_in_train: int) -> None:
    """Every train line is kept or counted as dropped; kept sentences are stripped single lines."""
    pairs = corpus.splits["train"]
    assert len(pairs) + corpus.dropped["train"] == lines_in_train
    for pair in pairs:
        for side in pair:
            assert side and side == side.strip() and side.splitlines() == [side], pair


@settings(FUZZ, max_examples=100)
@given(data=fuzz_bytes)
@example(data=b"")
@example(data="a\x0cb\n\x85\nc\u2028d\r\ne\rf".encode())
def test_read_lines_splits_on_newline_only(base, data):
    with scratch(base) as folder:
        path = folder / "lines.txt"
        path.write_bytes(data)
        lines = api(lambda: read_lines(path))
        if isinstance(lines, Exception):
            assert not data or not is_utf8(data), f"read_lines refused valid UTF-8: {lines}"
            return
        assert len(lines) == count_lines(data)
        assert all("\n" not in line for line in lines)


@settings(FUZZ, max_examples=60)
@given(data=st.one_of(fuzz_bytes, st.lists(st.tuples(line_text, line_text), min_size=1, max_size=5).map(
    lambda rows: "".join(f"{s}\t{t}\n" for s, t in rows).encode())))
def test_tsv_pairs(base, data):
    with scratch(base) as folder:
        path = folder / "pairs.tsv"
        path.write_bytes(data)
        pairs = api(lambda: list(tsv_pairs(path)))
        if not isinstance(pairs, Exception):
            assert len(pairs) == count_lines(data)
            assert all(len(pair) == 2 and "\t" not in pair[0] + pair[1] for pair in pairs)


tsv_files = st.one_of(
    fuzz_bytes,
    st.lists(st.tuples(line_text, line_text), min_size=1, max_size=6).map(
        lambda rows: "".join(f"{s}\t{t}\n" for s, t in rows).encode()),
    st.lists(st.tuples(line_text, line_text), min_size=1, max_size=6).map(
        lambda rows: ("\ufeff" + "\r\n".join(f"{s}\t{t}" for s, t in rows)).encode()),
)


@settings(FUZZ, max_examples=100)
@given(data=tsv_files, compression=st.sampled_from(["none", "xz", "xz-truncated", "xz-garbage"]))
@example(data=b"a\tb\n", compression="xz-garbage")
@example(data=b"a\tb\n", compression="xz-truncated")
@example(data="a\x85b\tc\u2028d\nx\ry\tz\x0cw\n".encode(), compression="none")
def test_load_corpus_tsv_file(base, data, compression):
    with scratch(base) as folder:
        if compression == "none":
            path, raw = folder / "corpus.tsv", data
        else:
            path = folder / "corpus.tsv.xz"
            raw = {"xz": lzma.compress(data), "xz-truncated": lzma.compress(data)[:-7],
                   "xz-garbage": b"\xfd7zXZ\x00" + data}[compression]
        path.write_bytes(raw)
        corpus = api(lambda: load_corpus(str(path)))
        if not isinstance(corpus, Exception):
            check_corpus(corpus, count_lines(data))


@settings(FUZZ, max_examples=100)
@given(
    src=st.integers(0, 5).flatmap(lambda n: st.tuples(line_files(n), line_files(n))) | st.tuples(line_files(), line_files()),
    dev=st.sampled_from(["none", "both", "src only", "valid"]),
    languages=st.sampled_from(["given", "src given", "inferred from folder name", "none"]),
)
@example(src=("a\x0cb\nc\x85d\ne\u2028f\n".encode(), b"1\n2\n3\n"), dev="none", languages="given")
@example(src=(b"a\rb\n", b"c\n"), dev="none", languages="given")
def test_load_corpus_text_folder(base, src, dev, languages):
    source, target = src
    with scratch(base) as root:
        folder = root / "xx-yy"
        folder.mkdir()
        (folder / "train.xx").write_bytes(source)
        (folder / "train.yy").write_bytes(target)
        if dev in ("both", "src only", "valid"):
            name = "valid" if dev == "valid" else "dev"
            (folder / f"{name}.xx").write_bytes(target)
            if dev != "src only":
                (folder / f"{name}.yy").write_bytes(source)
        langs = {"given": ("xx", "yy"), "src given": ("xx", None)}.get(languages, (None, None))
        spec = str(folder if languages != "none" else folder.rename(root / "data"))
        corpus = api(lambda: load_corpus(spec, *langs))
        if not isinstance(corpus, Exception):
            assert (corpus.src_lang, corpus.tgt_lang) == ("xx", "yy")
            assert count_lines(source) == count_lines(target)
            check_corpus(corpus, count_lines(source))


@settings(FUZZ, max_examples=40)
@given(data=tsv_files)
@example(data="a\x85b\tc\u2028d\nx\ry\tz\x0cw\n".encode())
def test_corpus_export_writes_one_line_per_pair(base, data):
    """`aiayn corpus export`: the two files it writes have one line per kept pair, as wc -l counts."""
    with scratch(base) as folder:
        (folder / "corpus.tsv").write_bytes(data)
        status, out, err = run_cli(["corpus", "export", str(folder / "corpus.tsv"), "--split", "train",
                                    "--out", str(folder / "out")])
        check_cli_outcome(status, err)
        if status == 0:
            pairs = load_corpus(str(folder / "corpus.tsv")).splits["train"]
            for side in ("src", "tgt"):
                written = (folder / "out" / f"train.{side}").read_bytes()
                assert count_lines(written) == len(pairs) and written.endswith(b"\n")


@settings(FUZZ, max_examples=40)
@given(train=tsv_files, dev=st.none() | tsv_files)
def test_load_corpus_tsv_folder(base, train, dev):
    with scratch(base) as folder:
        (folder / "train.tsv").write_bytes(train)
        if dev is not None:
            (folder / "dev.tsv").write_bytes(dev)
        corpus = api(lambda: load_corpus(str(folder)))
        if not isinstance(corpus, Exception):
            check_corpus(corpus, count_lines(train))


@settings(FUZZ, max_examples=100)
@given(train=tree_bytes, dev=st.none() | tree_bytes, as_folder=st.booleans())
def test_load_corpus_treebank(base, train, dev, as_folder):
    with scratch(base) as folder:
        if as_folder:
            (folder / "train.mrg").write_bytes(train)
            if dev is not None:
                (folder / "dev.mrg").write_bytes(dev)
            spec = folder
        else:
            spec = folder / "bank.mrg"
            spec.write_bytes(train)
        corpus = api(lambda: load_corpus(str(spec)))
        if not isinstance(corpus, Exception):
            assert corpus.splits["train"]
            for words, tree in corpus.splits["train"]:
                assert words.splitlines() == [words] and tree.splitlines() == [tree]


def test_load_corpus_deep_treebank(tmp_path):
    """A tree nested 3000 deep: a corpus or a one-line error (not a RecursionError)."""
    (tmp_path / "deep.mrg").write_bytes(DEEP_TREE)
    api(lambda: load_corpus(str(tmp_path / "deep.mrg")))


# --------------------------------------------------------------------------------------------
# (2) `aiayn translate` and `aiayn score`: input files and stdin


def check_translation(data: bytes, status: int, out: bytes, err: str) -> None:
    """N input lines give N output lines, blank ones blank; valid UTF-8 always translates."""
    check_cli_outcome(status, err)
    if status != 0:
        assert not is_utf8(data), f"valid UTF-8 input failed: {err!r}"
        return
    n, n_out = count_lines(data), out.count(b"\n")
    assert n_out == n, f"{n} input lines gave {n_out} output lines"
    assert n == 0 or out.endswith(b"\n")
    if is_utf8(data):
        outputs = out.split(b"\n")
        for number, line in enumerate(data.decode("utf-8").split("\n")[:n]):
            if not line.strip():
                assert outputs[number] == b"", f"blank input line {number + 1} gave {outputs[number]!r}"


SEPARATOR_LINES = "a\x0cb\nc\x1cd\ne\x1df\ng\x1eh\ni\x85j\nk\u2028l\nm\u2029n\no\rp\nq\x0br\n".encode()


@settings(FUZZ, max_examples=100)
@given(data=line_files(), to_file=st.booleans())
@example(data=SEPARATOR_LINES, to_file=False)
@example(data="one\rtwo\nthree\x85four\n".encode(), to_file=False)
@example(data=b"", to_file=False)
def test_translate_input_file(base, model_dir, data, to_file):
    with scratch(base) as folder:
        (folder / "in.txt").write_bytes(data)
        argv = translate_argv(model_dir) + ["--input", str(folder / "in.txt")]
        if to_file:
            argv += ["--output", str(folder / "out.txt")]
        status, out, err = run_cli(argv)
        if to_file and status == 0:
            out = (folder / "out.txt").read_bytes()
        check_translation(data, status, out, err)


@pytest.mark.parametrize("byte", [0x0A, 0x0D, 0x0C, 0x1E])
def test_translate_output_that_spells_a_line_break(tmp_path, tokenizer, byte):
    """A byte-fallback model can write any separator (here, 58 times the byte); each input line
    still gives exactly one output line."""
    piece = next(i for i in range(tokenizer.vocab_size) if tokenizer.id_to_piece(i) == f"<0x{byte:02X}>")
    folder = make_model(tmp_path, tokenizer, piece)
    data = b"the small cat\n\na red bird\n"
    status, out, err = run_cli(translate_argv(folder), data)
    check_translation(data, status, out, err)
    assert status == 0, err


@settings(FUZZ, max_examples=100)
@given(data=line_files(), errors=st.sampled_from(["strict", "surrogateescape"]), dash=st.booleans())
@example(data=SEPARATOR_LINES, errors="strict", dash=False)
@example(data=b"ok\n\xff\xfe broken\n", errors="strict", dash=False)
@example(data=b"ok\n\xff\xfe broken\n", errors="surrogateescape", dash=False)
def test_translate_stdin(model_dir, data, errors, dash):
    status, out, err = run_cli(translate_argv(model_dir) + (["--input", "-"] if dash else []), data, errors)
    check_translation(data, status, out, err)


@st.composite
def score_inputs(draw) -> tuple[bytes, bytes]:
    if draw(st.booleans()):
        n = draw(st.integers(0, 4))
        return draw(line_files(n)), draw(line_files(n))
    return draw(line_files()), draw(line_files())


@settings(FUZZ, max_examples=40)
@given(files=score_inputs(), stdin=st.sampled_from([None, "strict", "surrogateescape"]),
       lang=st.sampled_from(["en", "en", "de", "zh", "xx"]))
@example(files=(b"", b""), stdin=None, lang="en")
@example(files=(b"a\x0cb\nc\n", b"a b\nc\n"), stdin=None, lang="en")
@example(files=(b"ref\n", b"\xffhyp\n"), stdin="surrogateescape", lang="en")
@example(files=(b"\n \t\n", b"a\nb\n"), stdin=None, lang="en")
def test_score(base, files, stdin, lang):
    ref, hyp = files
    with scratch(base) as folder:
        (folder / "ref").write_bytes(ref)
        argv = ["score", "--ref", str(folder / "ref"), "--lang", lang]
        if stdin is None:
            (folder / "hyp").write_bytes(hyp)
            status, out, err = run_cli(argv + ["--hyp", str(folder / "hyp")])
        else:
            status, out, err = run_cli(argv, hyp, stdin)
    check_cli_outcome(status, err)
    n_ref, n_hyp = count_lines(ref), count_lines(hyp)
    if is_utf8(ref) and is_utf8(hyp) and lang in ("en", "de", "zh"):  # "xx" may be refused first
        if n_ref != n_hyp:
            assert status != 0 and f"{n_hyp}" in err and f"{n_ref}" in err, (n_hyp, n_ref, err)
        elif n_ref and not any(line.strip() for line in ref.decode("utf-8-sig").split("\n")):
            assert status != 0 and "holds only blank lines" in err, err
        elif n_ref:
            assert status == 0, f"{n_ref} lines each failed to score: {err!r}"
    if status == 0:
        lines = out.decode("utf-8", "replace").split("\n")
        assert lines[0].startswith("sacreBLEU") and lines[1].startswith("chrF") and lines[2].startswith("paper protocol"), out


@settings(FUZZ, max_examples=40)
@given(ref=tree_bytes, hyp=tree_bytes, same=st.booleans())
def test_score_parse(base, ref, hyp, same):
    with scratch(base) as folder:
        (folder / "ref").write_bytes(ref)
        (folder / "hyp").write_bytes(ref if same else hyp)
        status, out, err = run_cli(["score", "--parse", "--ref", str(folder / "ref"), "--hyp", str(folder / "hyp")])
    check_cli_outcome(status, err)
    if status == 0:
        assert out.startswith(b"bracketing precision"), out


def test_score_parse_deep_tree(tmp_path):
    """Trees nested 3000 deep: a score or a one-line error (not a RecursionError)."""
    (tmp_path / "ref").write_bytes(DEEP_TREE)
    (tmp_path / "hyp").write_bytes(DEEP_TREE)
    status, out, err = run_cli(["score", "--parse", "--ref", str(tmp_path / "ref"), "--hyp", str(tmp_path / "hyp")])
    check_cli_outcome(status, err)


# --------------------------------------------------------------------------------------------
# (3) Config loaders

VALID_MODEL = {"architecture": "Transformer", **ModelConfig(vocab_size=300, **MODEL).to_dict()}
VALID_TRAIN = dataclasses.asdict(TrainConfig())
HINTS = {cls: typing.get_type_hints(cls) for cls in (ModelConfig, TrainConfig)}


def conforms(value, hint) -> bool:
    """Whether a JSON value is of a dataclass field's declared type (an int serves for a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return isinstance(value, str) and value in args
    if origin is typing.Union:
        return any(conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return type(value) in (int, float)
    return type(value) is hint


def check_types(config) -> None:
    for name, hint in HINTS[type(config)].items():
        value = getattr(config, name)
        assert conforms(value, hint), f"{type(config).__name__}.{name} = {value!r} was accepted for a {hint}"


@settings(FUZZ, max_examples=200)
@given(text=config_files(VALID_MODEL))
@example(text=b'{"dropout": "0.1"}')
@example(text=b'{"vocab_size": "300"}')
@example(text=b'{"activation": ["relu"]}')
@example(text=b'{"pad_id": null}')
@example(text=b'{"d_ff\\n2": 1}')
@example(text=b'[1, 2]')
@example(text=b'"d_model"')
@example(text=b'{"norm_first": "false"}')
@example(text=b'{"d_k": true}')
@example(text=b'{"architecture": ["Transformer"]}')
def test_read_config_returns_only_the_declared_types(base, text):
    """Stricter than "no traceback": a value of the wrong type is an error, never a config."""
    with scratch(base) as folder:
        (folder / CONFIG).write_bytes(text)
        result = api(lambda: read_config(folder))
        if not isinstance(result, Exception):
            architecture, config = result
            assert isinstance(architecture, str), f"architecture {architecture!r} accepted"
            check_types(config)


@settings(FUZZ, max_examples=150)
@given(
    model=st.none() | config_files({k: v for k, v in VALID_MODEL.items() if k != "architecture"}),
    recipe=st.none() | config_files(VALID_TRAIN),
)
@example(model=json.dumps(VALID_MODEL).encode(), recipe=json.dumps(VALID_TRAIN).encode())
@example(model=json.dumps({"vocab_size": 300}).encode(), recipe=b'{"label_smoothing": "0.1"}')
@example(model=json.dumps({"vocab_size": 300}).encode(), recipe=b'{"max_tokens": 5, "no_such_field": 1}')
@example(model=json.dumps({"vocab_size": 300}).encode(), recipe=b'[]')
def test_load_run_configs(base, model, recipe):
    with scratch(base) as run:
        if model is not None:
            (run / MODEL_CONFIG).write_bytes(model)
        if recipe is not None:
            (run / TRAIN_CONFIG).write_bytes(recipe)
        result = api(lambda: RunDir(run).configs())
        if not isinstance(result, Exception):
            assert isinstance(result[0], ModelConfig) and isinstance(result[1], TrainConfig)


@settings(FUZZ, max_examples=40)
@given(text=config_files(VALID_MODEL, values=small_json_values))
@example(text=json.dumps(VALID_MODEL).encode())
@example(text=json.dumps({**VALID_MODEL, "dropout": "0.1"}).encode())
@example(text=json.dumps({**VALID_MODEL, "architecture": "Trans\nformer"}).encode())
@example(text=json.dumps({**VALID_MODEL, "vocab_size": 10**15}).encode())
@example(text=json.dumps({**VALID_MODEL, "eos_id": 299, "bos_id": 0, "pad_id": 0}).encode())
def test_translate_run_with_fuzzed_config(base, model_dir, text):
    with scratch(base) as run:
        (run / "model").mkdir()
        for name in (WEIGHTS, TOKENIZER):
            shutil.copyfile(model_dir / name, run / "model" / name)
        (run / "model" / CONFIG).write_bytes(text)
        data = "the small cat\n\na red bird sees \x85 the river\n".encode()
        status, out, err = run_cli(translate_argv(run), data)
    check_cli_outcome(status, err)
    if status == 0:
        assert out.count(b"\n") == 3 and out.split(b"\n")[1] == b""
    if text == json.dumps(VALID_MODEL).encode():
        assert status == 0, err


# --------------------------------------------------------------------------------------------
# A few real processes: the stdin and stdout Python makes, the exit status, the traceback.


def aiayn(*argv, stdin: bytes = b"", env: typing.Optional[dict] = None):
    return subprocess.run([sys.executable, "-m", "aiayn", *map(str, argv)], input=stdin, capture_output=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])
def test_process_translate_stdin(model_dir, errors):
    """One process: the separator lines keep their count, and an invalid byte is a one-line error
    or a translation (never a traceback), whatever errors= the locale gives stdin (en_US.UTF-8:
    strict; C.UTF-8: surrogateescape)."""
    done = aiayn(*translate_argv(model_dir), stdin=SEPARATOR_LINES + b"ok\n\xff\xfe broken\n",
                 env={"PYTHONIOENCODING": f"utf-8:{errors}"})
    check_cli_outcome(done.returncode, done.stderr.decode("utf-8", "backslashreplace"))
    if done.returncode == 0:
        assert done.stdout.count(b"\n") == count_lines(SEPARATOR_LINES) + 2


def test_process_score_empty_files(tmp_path):
    (tmp_path / "ref").write_bytes(b"")
    (tmp_path / "hyp").write_bytes(b"")
    done = aiayn("score", "--ref", tmp_path / "ref", "--hyp", tmp_path / "hyp")
    check_cli_outcome(done.returncode, done.stderr.decode("utf-8", "backslashreplace"))


def test_process_translate_config_of_the_wrong_type(tmp_path, model_dir):
    (tmp_path / "model").mkdir()
    for name in (WEIGHTS, TOKENIZER):
        shutil.copyfile(model_dir / name, tmp_path / "model" / name)
    (tmp_path / "model" / CONFIG).write_text(json.dumps({**VALID_MODEL, "dropout": "0.1"}), encoding="utf-8")
    done = aiayn(*translate_argv(tmp_path), stdin=b"the small cat\n")
    assert done.returncode != 0
    check_cli_outcome(done.returncode, done.stderr.decode("utf-8", "backslashreplace"))
