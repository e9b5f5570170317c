"""The README's Python examples against the package as it is: every name they import exists,
and the model and Translator examples run as printed (the Translator's on the fixtures' tiny run
in place of runs/demo, which a checkout does not have)."""

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def test_every_name_the_readme_s_examples_import_exists():
    assert len(BLOCKS) >= 4
    for block in BLOCKS:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                missing = [alias.name for alias in node.names if not hasattr(module, alias.name)]
                assert not missing, f"the README imports {missing} from {node.module}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)


def block_that(says: str) -> str:
    (block,) = [b for b in BLOCKS if says in b]
    return block


def test_the_model_example_runs_as_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it saves "my-model" where it runs
    names: dict = {}
    exec(block_that("model.init_cache"), names)
    assert tuple(names["logits"].shape) == (1, 3, 8000) and (tmp_path / "my-model" / "model.safetensors").is_file()
    assert not names["model"].training


def test_the_translator_example_runs_on_a_model_folder(tiny_run):
    block = block_that("Translator.load").replace('"runs/demo/averaged"', repr(str(tiny_run / "averaged")))
    names: dict = {}
    exec(block.replace("progress=True", "progress=False"), names)
    result = names["result"]
    assert 0 <= result.bleu <= 100 and result.seconds > 0 and "nrefs:1" in result.signature
