"""Saving and loading models: safetensors weights with a JSON config beside them.

A model folder holds `model.safetensors` and `config.json` (the resolved `ModelConfig` plus the
architecture's name). Every file is written to a temporary name in the same folder and then
renamed over the old one, so a crash mid-write never leaves a half-written file behind.
Nothing is ever unpickled.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Union

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from safetensors.torch import load_model as _load_safetensors
from safetensors.torch import save_model as _save_safetensors

from aiayn.config import ModelConfig

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _usual_mode(path: Union[str, Path], directory: bool = False) -> None:
    """mkstemp and mkdtemp create private files (0600, 0700); give them the mode that `open` and
    `mkdir` would, so that a run folder shared with a group stays readable by it."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write(path: Union[str, Path], write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, fsync, then rename tmp_path to `path` (atomic on POSIX). A write
    that fails (a full disk, a file size limit) leaves nothing behind and is an OSError that
    names `path`, whichever library wrote (safetensors reports its own error type)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        _usual_mode(tmp)  # after writing: some writers (safetensors) create the file anew
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, (OSError, SafetensorError)):
            raise OSError(f"cannot write {path}: {' '.join(str(error).split())}") from None
        raise


def refuse_to_replace(path: Union[str, Path], force: bool, inputs: Iterable[Union[str, Path]] = ()) -> None:
    """The one rule for outputs: writing `path` may replace something (a file, or a folder that
    is not empty) only with `force`, and never what the command reads: an output that is one of
    its `inputs`, holds one or lies inside one is refused, `force` or not, since replacing it
    would delete the input (symbolic links and `..` resolved). Commands call it before their
    work, so that the refusal comes before minutes of decoding rather than after."""
    path = Path(path)
    out = path.resolve()
    for source in inputs:
        read = Path(source).resolve()
        if out == read:
            raise ValueError(f"{path} is an input of this command ({source}); choose another output")
        if out in read.parents:
            raise ValueError(f"{path} holds {source}, an input of this command; choose another output")
        if read in out.parents:
            raise ValueError(f"{path} lies inside {source}, an input of this command; choose another output")
    if not force and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} already exists; pass --force to replace it")


LOCK = ".lock"  # a run folder's writer lock (see `run_lock`)
_held: set[Path] = set()  # the lock files this process holds: `aiayn demo` locks its folder, then trains in it


@contextmanager
def writer_lock(lock_file: Union[str, Path], what: Union[str, Path], remove: bool = False) -> Iterator[None]:
    """One writer at a time for `what` (a run folder, an output folder): an exclusive `flock` on
    `lock_file` while the block runs, with the holder's PID written in it. The kernel lets a
    flock go when its process ends, however it ends (SIGKILL included), so no lock outlives its
    writer and none needs cleaning up. A second writer is refused at once, in one line naming
    the holder. Taking a lock this process holds already is a no-op. With `remove` the file is
    deleted on release (while still locked, so that a writer waiting on the old file notices it
    is gone and takes a new one rather than sharing a lock no one else sees)."""
    lock_file = Path(lock_file).resolve()
    if lock_file in _held:
        yield
        return
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(lock_file, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ValueError(f"{what} is being written by another process (PID {holder}); "
                             "wait for it to end or choose another folder") from None
        try:
            if os.stat(lock_file).st_ino == os.fstat(handle.fileno()).st_ino:
                break  # the file is still the one at that path: the lock is ours
        except FileNotFoundError:
            pass  # its holder removed it as we opened it
        handle.close()
    with handle:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        _held.add(lock_file)
        try:
            yield
        finally:
            _held.discard(lock_file)
            if remove:
                lock_file.unlink(missing_ok=True)


def run_lock(run_dir: Union[str, Path]) -> AbstractContextManager:
    """The writer lock of a run folder (train, experiment, demo): RUN_DIR/.lock, which stays."""
    return writer_lock(Path(run_dir) / LOCK, run_dir)


def output_lock(out: Union[str, Path]) -> AbstractContextManager:
    """The writer lock of an output folder that is built elsewhere and renamed into place
    (`atomic_dir`, as `average` writes): a hidden `.NAME.lock` beside it, removed when done."""
    out = Path(out)
    return writer_lock(out.parent / f".{out.name}.lock", out, remove=True)


def atomic_dir(path: Union[str, Path], build: Callable[[Path], None], force: bool = False) -> None:
    """Call `build(tmp_dir)` on a new hidden folder beside `path`, then rename it to `path`, so a
    crash never leaves half a folder (weights without their tokenizer). An existing `path` (but
    an empty folder) is an error unless `force`, and then it is replaced whole: no file of the
    old one stays."""
    path = Path(path)
    refuse_to_replace(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        _usual_mode(tmp, directory=True)
        build(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old.tmp", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):  # name the folder being written, not its hidden stand-in
            raise OSError(str(error).replace(str(tmp), str(path))) from None
        raise


def remove_litter(directory: Union[str, Path]) -> list[Path]:
    """Delete what an interrupted write left in a run folder: the hidden temporary files and
    folders of `atomic_write`, `atomic_dir` and `save_checkpoint` (`.NAME.*.tmp`, `.step_*`).
    Returns what was removed."""
    directory = Path(directory)
    found = []
    for folder in (directory, directory / "model", directory / CHECKPOINTS):
        if folder.is_dir():
            found += [p for p in folder.iterdir() if p.name.startswith(".")
                      and (p.name.endswith(".tmp") or (folder.name == CHECKPOINTS and p.name.startswith(".step_")))]
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


def read_json(path: Union[str, Path]):
    """The JSON value a file holds; a file that is not JSON (cut short, not UTF-8) is a ValueError
    naming it. A missing file is FileNotFoundError, for the caller to explain."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


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
    directory = Path(directory)
    architecture, config = read_config(directory)
    if architecture != cls.__name__:
        raise ValueError(f"{directory} holds a {architecture!r}, not a {cls.__name__}")
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS} in {directory}")
    model = build_model(cls, config, directory / CONFIG)
    load_weights(model, weights, device)
    return model.to(device)


def build_model(cls, config, source: Union[str, Path]) -> torch.nn.Module:
    """`cls(config)`, once its size is known to fit: the model is first built on the meta device
    (shapes, no memory), and one whose weights would not fit in the memory available now (a
    config from `source` with "vocab_size": 10**12) is refused in one line rather than
    allocated until the system kills the process."""
    from aiayn.device import available_bytes

    def refuse(error: BaseException) -> ValueError:
        return ValueError(f"cannot build the model {source} describes: {' '.join(str(error).split())[:200]}")

    try:
        with torch.device("meta"):
            shapes = cls(config)
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
        atomic_write(Path(destination) / path.name, lambda tmp, path=path: shutil.copyfile(path, tmp))
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
        _usual_mode(tmp, directory=True)
        save_model(model, tmp)
        tensors, groups = _flatten_optimizer(optimizer.state_dict())
        atomic_write(tmp / OPTIMIZER, lambda path: save_file({k: v.contiguous() for k, v in tensors.items()}, path))
        write_json(tmp / TRAINER, {**trainer_state, "step": step, "param_groups": groups})
        copy_tokenizer(run_dir, tmp)
        if final.exists():  # a resumed run reached this step again; the new one replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):  # name the checkpoint being written, not its hidden stand-in
            raise OSError(str(error).replace(str(tmp), str(final))) from None
        raise
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old)
    return final


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


def average_checkpoints(directories: list[Path], out: Union[str, Path], force: bool = False) -> None:
    """§6.1: a model whose weights are the mean of the checkpoints' (summed in float64), written
    as a model folder with the tokenizer of the newest checkpoint (atomically; an existing `out`
    only with `force`). One checkpoint is in memory at a time, so averaging the 20 of a big model
    needs no more than two copies of it."""
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

    def build(folder: Path) -> None:
        save_model(model, folder)
        copy_tokenizer(directories[-1], folder)

    atomic_dir(out, build, force)


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
