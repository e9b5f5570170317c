"""Saving and loading models: safetensors weights with a JSON config beside them.

A model folder holds `model.safetensors` and `config.json` (the resolved `ModelConfig` plus the
architecture's name). Every file is written to a temporary name in the same folder and then
renamed over the old one, so a crash mid-write never leaves a half-written file behind.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _load_safetensors
from safetensors.torch import save_model as _save_safetensors

from aiayn.config import ModelConfig

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def atomic_write(path: Union[str, Path], write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, fsync, then rename tmp_path to `path` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Union[str, Path], value) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(value, handle, indent=2, sort_keys=True)
            handle.write("\n")

    atomic_write(path, write)


def save_model(model: torch.nn.Module, directory: Union[str, Path]) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created if missing)."""
    directory = Path(directory)
    atomic_write(directory / WEIGHTS, lambda tmp: _save_safetensors(model, tmp))
    write_json(directory / CONFIG, {"architecture": type(model).__name__, **model.config.to_dict()})


def read_config(directory: Union[str, Path]) -> tuple[str, ModelConfig]:
    """(architecture name, ModelConfig) from `directory/config.json`, with one-line errors."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG} in {directory}: not an aiayn model folder")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object")
    architecture = values.pop("architecture", "Transformer")
    return architecture, ModelConfig.from_dict(values)


def load_model(cls, directory: Union[str, Path], device: Union[str, torch.device] = "cpu"):
    """Build `cls` from `directory/config.json` and fill it from `directory/model.safetensors`."""
    directory = Path(directory)
    architecture, config = read_config(directory)
    if architecture != cls.__name__:
        raise ValueError(f"{directory} holds a {architecture}, not a {cls.__name__}")
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS} in {directory}")
    model = cls(config)
    try:
        _load_safetensors(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise ValueError(f"{weights} does not match its config.json: {first_line}") from None
    return model.to(device)


# --------------------------------------------------------------------------------------------
# Training checkpoints: a model folder plus the optimiser, the RNG and the trainer's position.

CHECKPOINTS = "checkpoints"
OPTIMIZER = "optimizer.safetensors"
TRAINER = "trainer.json"
TOKENIZER = "tokenizer.model"
# A model folder holds its tokenizer: aiayn's one SentencePiece model, or Marian's three files.
TOKENIZER_FILES = (TOKENIZER, "source.spm", "target.spm", "vocab.json")


def copy_tokenizer(source: Union[str, Path], destination: Union[str, Path]) -> bool:
    """Copy whichever tokenizer files `source` holds into `destination`; False if it holds none."""
    found = [Path(source) / name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
    for path in found:
        shutil.copyfile(path, Path(destination) / path.name)
    return bool(found)


def checkpoint_dirs(run_dir: Union[str, Path]) -> list[Path]:
    """The finished checkpoints of a run, oldest first (unfinished ones are hidden temp dirs)."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_"))


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], list]:
    """torch optimiser state -> (tensors for safetensors, JSON-able param groups)."""
    tensors = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            tensors[f"state.{index}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return tensors, state["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list) -> dict:
    state: dict = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    run_dir: Union[str, Path],
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    keep_last: int = 5,
) -> Path:
    """Write `run_dir/checkpoints/step_NNNNNNNN` atomically (built in a temp dir, then renamed),
    with the run's tokenizer, then delete all but the newest `keep_last` checkpoints."""
    folder = Path(run_dir) / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:08d}.", dir=folder))
    try:
        save_model(model, tmp)
        tensors, groups = _flatten_optimizer(optimizer.state_dict())
        tensors["rng.torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / OPTIMIZER))
        write_json(tmp / TRAINER, {**trainer_state, "step": step, "param_groups": groups})
        copy_tokenizer(run_dir, tmp)
        if final.exists():  # a resumed run reached this step again; the new one replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


def load_checkpoint(directory: Union[str, Path], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model weights, optimiser state and the RNG in place; return the trainer state."""
    directory = Path(directory)
    _load_safetensors(model, str(directory / WEIGHTS), strict=True, device=str(next(model.parameters()).device))
    tensors = load_file(str(directory / OPTIMIZER))
    torch.set_rng_state(tensors.pop("rng.torch"))
    cuda_rng = tensors.pop("rng.cuda", None)
    if cuda_rng is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda_rng)
    trainer_state = json.loads((directory / TRAINER).read_text(encoding="utf-8"))
    optimizer.load_state_dict(_unflatten_optimizer(tensors, trainer_state.pop("param_groups")))
    return trainer_state


def average_checkpoints(directories: list[Path], out: Union[str, Path]) -> None:
    """§6.1: a model whose weights are the mean of the checkpoints' (summed in float64), written
    as a model folder with the tokenizer of the newest checkpoint. One checkpoint is in memory
    at a time, so averaging the 20 of a big model needs no more than two copies of it."""
    from aiayn import model as models

    architecture, config = read_config(directories[-1])
    cls = getattr(models, architecture)
    total: dict[str, torch.Tensor] = {}
    for directory in directories:
        if read_config(directory) != (architecture, config):
            raise ValueError(f"{directory} holds another model than {directories[-1]}; cannot average")
        for name, tensor in load_model(cls, directory).state_dict().items():
            total[name] = total[name] + tensor.double() if name in total else tensor.double()
    model = cls(config)
    model.load_state_dict({name: value / len(directories) for name, value in total.items()})
    save_model(model, out)
    copy_tokenizer(directories[-1], out)


def resolve_model_dir(path: Union[str, Path]) -> Path:
    """A model folder (config.json + model.safetensors) from a path that is one, or a run folder
    (its final `model/`, else its newest checkpoint)."""
    path = Path(path)
    if (path / CONFIG).is_file() and (path / WEIGHTS).is_file():
        return path
    if (path / "model" / CONFIG).is_file():
        return path / "model"
    found = checkpoint_dirs(path)
    if found:
        return found[-1]
    raise FileNotFoundError(f"{path} is neither a model folder nor a run folder with a model or checkpoints")
