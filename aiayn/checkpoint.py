"""Saving and loading models: safetensors weights with a JSON config beside them.

A model folder holds `model.safetensors` and `config.json` (the resolved `ModelConfig` plus the
architecture's name). Every file is written to a temporary name in the same folder and then
renamed over the old one, so a crash mid-write never leaves a half-written file behind.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Union

import torch
from safetensors import SafetensorError
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
