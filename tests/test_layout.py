"""The package's shape (../shared/DESIGN.md §1), held by reading its source:

- the layers import only downward, and no two modules import each other, directly or around a
  loop, counting the imports inside functions;
- only aiayn.run spells the names of a run folder's files and folders;
- only aiayn.config holds a default for decoding or for a serving or input limit;
- every test the README and docs/ cite by name exists.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

from aiayn.config import DecodeConfig, ServeOptions

PACKAGE = Path(__file__).resolve().parent.parent / "aiayn"

# The layer order, written once: a module may import from its own layer and the ones below it.
LAYERS = {
    "base": ["files", "resumable", "lines", "device", "kernel_cache", "errors"],
    "paper": ["config", "flops", "optim", "loss", "kernels", "train_kernels", "inference", "attention", "cache", "model", "graphs", "search", "tokenizer",
              "checkpoint", "parsing", "corpora", "batching"],
    "application": ["run", "store", "prepare", "sentences", "translate", "decode_files", "evaluate", "train", "marian", "ct2", "visualize"],
    "front ends": ["cli", "demo", "table3", "experiment", "serve", "__main__"],
}
ORDER = list(LAYERS)


def modules() -> dict[str, Path]:
    """Dotted names under aiayn (serve.app, ...) -> their files; the package root is left out."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found[".".join(parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The aiayn modules a file imports, anywhere in it (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "aiayn":
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith("aiayn."):
                dotted = name[len("aiayn."):]
                while dotted and dotted not in known:
                    dotted = dotted.rpartition(".")[0]
                if dotted:
                    found.add(dotted)
    return found


def layer(module: str) -> int:
    top = module.split(".")[0]
    matches = [i for i, name in enumerate(ORDER) if top in LAYERS[name]]
    assert matches, f"aiayn.{module} is in no layer of LAYERS: add it where it belongs"
    return matches[0]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_layers_import_only_downward():
    upward = [f"aiayn.{module} ({ORDER[layer(module)]}) imports aiayn.{target} ({ORDER[layer(target)]})"
              for module, targets in graph().items() for target in sorted(targets) if layer(target) > layer(module)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                loop = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(f"aiayn.{m}" for m in loop))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_the_checker_sees_a_cycle_and_an_upward_arrow(tmp_path):
    """The two checks above could pass by reading nothing: this one feeds them a known cycle."""
    (tmp_path / "a.py").write_text("def f():\n    from aiayn.b import g\n")
    (tmp_path / "b.py").write_text("from aiayn import a\n")
    assert imports(tmp_path / "a.py", {"a", "b"}) == {"b"} and imports(tmp_path / "b.py", {"a", "b"}) == {"a"}
    assert layer("cli") > layer("train") > layer("model") > layer("files")


def constants(path: Path):
    """(line, value) of every string constant of a file that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


RUN_NAMES = {"log.jsonl", "loss.png", "model_config.json", "train_config.json", "checkpoints", "averaged"}


def test_only_run_spells_the_run_folder():
    found = [f"aiayn/{path.relative_to(PACKAGE)}:{line}: {value!r}"
             for name, path in modules().items() if name != "run"
             for line, value in constants(path) if value in RUN_NAMES or value.startswith("step_")]
    assert not found, "spell these through aiayn.run.RunDir:\n" + "\n".join(found)


# Fields whose defaults live in aiayn.config alone: decoding settings, and the limits of inputs.
DEFAULTED = {f.name for f in dataclasses.fields(DecodeConfig)} | {f.name for f in dataclasses.fields(ServeOptions)
                                                                   if f.name.startswith(("max_", "read_", "drain_"))}
# What turns a setting off is no default: one beam, no length penalty, no guard.
NEUTRAL = {"beam": 1, "alpha": 0, "min_len": 0, "no_repeat_ngram": 0, "no_repeat_ngram_size": 0, "repetition_penalty": 1}
# The callables that take decoding settings by keyword (matplotlib's alpha is another alpha).
DECODING_CALLS = {"translate_ids", "translate", "translate_stream", "beam_search", "greedy", "DecodeConfig", "replace",
                  "Translator", "create_app", "Batcher", "Options", "ModelStep", "init_cache"}


def literal_defaults(path: Path):
    """(line, name) of every parameter, decoding call's keyword or class field in DEFAULTED given
    a number other than its neutral value."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        pairs = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs += list(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            pairs += [(k.arg, k.value) for k in node.keywords if k.arg and called in DECODING_CALLS]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            pairs.append((node.target.id, node.value))
        for name, value in pairs:
            if name in DEFAULTED and isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) \
                    and not isinstance(value.value, bool) and NEUTRAL.get(name) != value.value:
                yield value.lineno, name


def test_only_config_holds_decoding_defaults_and_limits():
    found = [f"aiayn/{path.relative_to(PACKAGE)}:{line}: {name}"
             for module, path in modules().items() if module != "config" for line, name in literal_defaults(path)]
    assert not found, "take these from aiayn.config:\n" + "\n".join(found)


def test_sizes():
    """No module over ~500 lines without a reason in its docstring (a paragraph "Length: ...")."""
    long = [f"aiayn/{path.relative_to(PACKAGE)}: {lines} lines" for path in PACKAGE.rglob("*.py")
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 520
            and "Length:" not in (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")]
    assert not long, "\n".join(long)
    assert len((PACKAGE / "cli.py").read_text(encoding="utf-8").splitlines()) < 400


def test_function_sizes():
    """No function over ~60 lines without a reason in its docstring ("Length: ...")."""
    long = [f"aiayn/{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 65
            and "Length:" not in (ast.get_docstring(node) or "")]
    assert not long, "\n".join(long)


def test_every_test_the_docs_cite_exists():
    """docs/robustness.md backs each row with the tests that hold it: a test renamed or removed
    leaves a row that no test holds, which reads as if one did. There a test without its file is
    in tests/test_faults.py, as the page says (found in review: about 70 names were in other files)."""
    import re

    root = PACKAGE.parent
    defined = {path.name: set(re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
               for path in (root / "tests").glob("test_*.py")}
    every = set().union(*defined.values())
    wrong = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        unnamed = defined["test_faults.py"] if doc.name == "robustness.md" else every
        for file, name in re.findall(r"\b(?:(test_\w+\.py)::)?(test_\w+)\b(?!\.py)", doc.read_text(encoding="utf-8")):
            if (name not in defined.get(file, ())) if file else (name not in unnamed and f"{name}.py" not in defined):
                wrong.append(f"{doc.name}: {file + '::' if file else ''}{name}")
    assert not wrong, "\n".join(wrong)
