"""Model folders and training checkpoints on disk, as safetensors with a JSON config beside them.

A model folder holds `model.safetensors` and `config.json` (the architecture's name and its
`ModelConfig`), and the tokenizer that goes with it. A checkpoint is a model folder plus Adam's
moments (`optimizer.safetensors`) and the trainer's position (`trainer.json`). Nothing here
unpickles: safetensors holds tensors only. Where a run keeps its checkpoints is aiayn.run's
business; this module reads and writes one folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _load_safetensors
from safetensors.torch import save_model as _save_safetensors
from torch.overrides import TorchFunctionMode

from aiayn.config import ModelConfig
from aiayn.device import available_bytes, resolve_device
from aiayn.files import atomic_dir, atomic_write, read_json, write_json
from aiayn.tokenizer import copy_tokenizer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
OPTIMIZER = "optimizer.safetensors"
TRAINER = "trainer.json"
STEP_KEY = "step"  # of the weights' safetensors metadata: the training step they are of


def save_model(model: torch.nn.Module, directory: Union[str, Path], step: Optional[int] = None, force: bool = False) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created if missing), beside
    what else it holds (a tokenizer); `step`, the training step of the weights, goes into the
    safetensors header's metadata. A model there already is replaced only with `force` (found in
    review: `Transformer.save` replaced a run's model/ without a word, its tokenizer left beside)."""
    check_path(directory, "a folder to save the model in")
    if (made := getattr(model, "inference_precision", None)) is not None:  # (found by a misuse hunt: translator.model.save
        # wrote a folder without the laid-out or int8 weights, which no load read back)
        raise ValueError(f"this is a decoding copy in {made} (Translator.model), whose weights are laid out for decoding: "
                         "save the model it was made from (Transformer.load(folder), or the one you trained)")
    directory = Path(directory)
    held = [name for name in (WEIGHTS, CONFIG) if (directory / name).exists()]
    if held and not force:
        raise FileExistsError(f"{directory} holds a model already ({held[0]}); pass force=True to replace it")
    metadata = None if step is None else {STEP_KEY: str(step)}
    # A crash between the two files leaves the new weights without a config, not beside the old
    # one, which might pass for theirs (found in review).
    (directory / CONFIG).unlink(missing_ok=True)
    atomic_write(directory / WEIGHTS, lambda tmp: _save_safetensors(model, tmp, metadata=metadata))
    write_json(directory / CONFIG, {"architecture": type(model).__name__, **model.config.to_dict()})


def saved_step(directory: Union[str, Path]) -> Optional[int]:
    """The training step `save_model` recorded in `directory`'s weights (their header alone is
    read), or None: none recorded, or no readable weights."""
    try:
        with safe_open(str(Path(directory) / WEIGHTS), "pt") as weights:
            value = (weights.metadata() or {}).get(STEP_KEY, "")
    except (OSError, SafetensorError):
        return None
    return int(value) if value.isdecimal() else None  # (isdigit() takes "²", which int() refuses)


def check_path(path: object, what: str) -> Path:
    """`path` as a Path; a TypeError naming what was given where the path of `what` was wanted (a
    model object, say; found by misuse hunts: pathlib's "expected str, bytes or os.PathLike")."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"give the path of {what}, not a {type(path).__name__}"
                        + (" (save it first: model.save(FOLDER))" if isinstance(path, torch.nn.Module) else ""))
    return Path(path)


def read_config(directory: Union[str, Path]) -> tuple[str, ModelConfig]:
    """(architecture name, ModelConfig) from `directory/config.json`, with one-line errors."""
    check_path(directory, "a model folder")  # (found by a misuse hunt: "expected str, bytes or os.PathLike")
    if not Path(directory).is_dir():  # (found by a misuse hunt: "no config.json in nope")
        raise FileNotFoundError(f"no such folder: {directory}" if not Path(directory).exists() else
                                f"{directory} is a file, not a model folder")
    path = Path(directory) / CONFIG
    if not path.is_file():
        # A folder that holds a model folder (a run's model/ first): said where (found in review: a run folder)
        # model/ first, then the newest step_N (found by a misuse hunt: the oldest was named)
        inner = sorted(sorted((config.parent for config in Path(directory).glob(f"*/{CONFIG}")), reverse=True),
                       key=lambda f: f.name != "model")
        hint = "" if not inner else f"; it holds one, {inner[0]}" + (
            " (a run's final model: Translator.load takes the run folder whole)" if inner[0].name == "model" else "")
        raise FileNotFoundError(f"no {CONFIG} in {directory}: not an aiayn model folder{hint}")
    values = read_json(path)
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object")
    architecture = values.pop("architecture", "Transformer")
    if not isinstance(architecture, str):
        raise ValueError(f"{path}: architecture must be a string, got {architecture!r}")
    try:
        return architecture, ModelConfig.from_dict(values)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def load_model(cls, directory: Union[str, Path], device: Union[str, torch.device] = "cpu"):
    """Build `cls` from `directory/config.json` and fill it from `directory/model.safetensors`."""
    device = resolve_device(str(device))  # (found by a misuse hunt: "cuda" without one was safetensors' "pin_memory=True ...")
    architecture, config = read_config(directory)
    directory = Path(directory)
    if architecture != cls.__name__:
        raise ValueError(f"{directory} holds a {architecture!r}, not a {cls.__name__}")
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS} in {directory}")
    model = build_model(cls, config, directory / CONFIG)
    load_weights(model, weights, device)
    return model.to(device)


# What filling a new model's tensors calls: values only, which meta tensors do not hold.
_FILLS = {"normal_", "uniform_", "zero_", "fill_", "copy_", "ones_", "zeros_", "constant_", "trunc_normal_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "eye_"}


class _NoInitOnMeta(TorchFunctionMode):
    """Skips the fills of meta tensors (`_FILLS`): PyTorch runs them through its Python
    references, whose first call imports Dynamo, about 2 of a command's 6 seconds on a slow CPU
    (an AMD EPYC Zen 3, torch 2.13). Every other operation, one that changes a shape too, runs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # torch.nn.init's functions pass their tensor by keyword, a Tensor method as `self`
        target = args[0] if args else kwargs.get("tensor")
        if getattr(func, "__name__", "") in _FILLS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def meta_model(cls, config) -> torch.nn.Module:
    """`cls(config)` on the meta device: its parameters' and buffers' shapes, no memory."""
    with torch.device("meta"), _NoInitOnMeta():
        return cls(config)


def parameter_counts(cls, config) -> dict[str, int]:
    """The trainable parameters of `cls(config)`, a Transformer: {"embeddings", "encoder", "decoder",
    "total"} (the encoder and decoder without their embeddings), counted on the meta device. The
    N layers of a stack are alike, so models of 1 and 2 layers give them all (found in review:
    100,000 layers were built one by one, for minutes); sizes past what PyTorch can describe are
    a ValueError, not its overflow."""
    def counts(layers: int) -> dict[str, int]:
        try:
            model = meta_model(cls, dataclasses.replace(config, n_layers=layers))
        except (RuntimeError, MemoryError, OverflowError, TypeError) as error:  # TypeError: a size past int64
            reason = str(error).splitlines()[0].split(" Exception raised from")[0][:160]  # not the C++ stack
            raise ValueError(f"this model is too large to describe: {reason}") from None
        stacks = {side: sum(p.numel() for n, p in getattr(model, side).named_parameters() if not n.startswith("embed."))
                  for side in ("encoder", "decoder")}
        return {**stacks, "total": model.num_parameters()}

    one, two = counts(1), counts(2)
    found = {key: one[key] + (config.n_layers - 1) * (two[key] - one[key]) for key in one}
    return {"embeddings": found["total"] - found["encoder"] - found["decoder"], **found}


def build_model(cls, config, source: Union[str, Path]) -> torch.nn.Module:
    """`cls(config)`, once its size is known to fit: the model is first built on the meta device
    (shapes, no memory), and one whose weights would not fit in the memory available now (a
    config from `source` with "vocab_size": 10**12) is refused in one line rather than
    allocated until the system kills the process."""
    def refuse(error: BaseException) -> ValueError:
        return ValueError(f"cannot build the model {source} describes: {' '.join(str(error).split())[:200]}")

    try:
        shapes = meta_model(cls, config)
    except (RuntimeError, MemoryError) as error:
        raise refuse(error) from None
    needed = sum(t.numel() * t.element_size() for t in (*shapes.parameters(), *shapes.buffers()))
    available = available_bytes()
    if available is not None and needed > available:
        raise ValueError(f"the model {source} describes needs {needed / 2**30:,.1f} GiB for its weights alone; "
                         f"{available / 2**30:,.1f} GiB of memory are available")
    try:
        return cls(config)
    except (RuntimeError, MemoryError) as error:
        raise refuse(error) from None


def load_weights(model: torch.nn.Module, weights: Union[str, Path], device: Union[str, torch.device] = "cpu") -> None:
    """Fill `model` from a safetensors file, naming the first tensor that does not fit."""
    try:
        with safe_open(str(weights), framework="pt") as handle:
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise ValueError(f"cannot read {weights} (cut short or not safetensors?): {error}") from None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    shared = {name for name in expected if name not in shapes and _is_tied(model, name)}
    problems = [f"it lacks {name}" for name in expected if name not in shapes and name not in shared]
    problems += [f"{name} is not in the model" for name in shapes if name not in expected]
    problems += [f"{name} has shape {list(shapes[name])}, the config wants {list(shape)}"
                 for name, shape in expected.items() if name in shapes and shapes[name] != shape]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{weights} does not match its config.json: {problems[0]}{more}")
    try:
        _load_safetensors(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError) as error:
        first_line = str(error).strip().splitlines()[-1].strip()
        raise ValueError(f"cannot load {weights}: {first_line}") from None


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    """Whether `name` is a second name of a tensor that safetensors stores once."""
    tensor = model.state_dict()[name]
    return sum(t.data_ptr() == tensor.data_ptr() for t in model.state_dict().values()) > 1


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


def write_checkpoint(
    folder: Union[str, Path],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict,
    tokenizer_from: Union[str, Path],
) -> None:
    """Write a checkpoint folder atomically (`atomic_dir`: built in a hidden folder beside it, then renamed):
    the model, the optimiser state, `trainer_state` and the tokenizer files of `tokenizer_from`.
    An existing checkpoint of that name (a resumed run that reached the step again) is replaced."""
    def build(tmp: Path) -> None:
        save_model(model, tmp)
        tensors, groups = _flatten_optimizer(optimizer.state_dict())
        atomic_write(tmp / OPTIMIZER, lambda path: save_file({k: v.contiguous() for k, v in tensors.items()}, path))
        write_json(tmp / TRAINER, {**trainer_state, "param_groups": groups})
        copy_tokenizer(tokenizer_from, tmp)

    atomic_dir(folder, build, force=True)


def load_checkpoint(directory: Union[str, Path], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore model weights and optimiser state in place; return the trainer state. (No random
    generator state: training seeds each step, see aiayn.train.step_seed.)"""
    directory = Path(directory)
    load_weights(model, directory / WEIGHTS, next(model.parameters()).device)
    try:
        tensors = load_file(str(directory / OPTIMIZER))
        trainer_state = json.loads((directory / TRAINER).read_text(encoding="utf-8"))
        for old_rng in ("rng.torch", "rng.cuda"):  # the one generator state that checkpoints before 2026-11 hold
            tensors.pop(old_rng, None)
        optimizer.load_state_dict(_unflatten_optimizer(tensors, trainer_state.pop("param_groups")))
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read the optimiser state of {directory}: {error}") from None
    return trainer_state
