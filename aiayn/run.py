"""A run folder: the one owner of its layout, and of "the model of this folder" for inference.

    RUN_DIR/
      model_config.json, train_config.json   the configs the run was started with (resumed with)
      tokenizer.model                         the run's tokenizer (Marian's three files when imported)
      data/                                   the corpus preprocessed for a run from --corpus (aiayn.store)
      log.jsonl, loss.png                     one JSON record a logged step or validation; its plot
      checkpoints/step_NNNNNNNN/              the newest `keep_last` checkpoints (aiayn.checkpoint)
      model/                                  the last weights as a model folder, with the tokenizer
      averaged/, attention/                   the demo's averaged model (§6.1) and attention maps
      .lock                                   held by the one process writing the run

No other module spells these names: they ask a `RunDir` for the path.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import torch

from aiayn.checkpoint import CONFIG, WEIGHTS, check_path, load_model, read_config, save_model, saved_step, write_checkpoint
from aiayn.config import AverageOptions, ModelConfig, TrainConfig
from aiayn.corpora import UNNAMED
from aiayn.files import (WORK_LOCK, atomic_dir, atomic_text, check_writable, discard_dir, naming, output_lock, read_json,
                         refuse_to_replace, remove_leftovers, write_json, writer_lock)
from aiayn import model as models
from aiayn.model import Transformer
from aiayn.tokenizer import TOKENIZER_FILES, copy_tokenizer, has_tokenizer, load_tokenizer, tokenizer_files
from aiayn.visualize import plot_losses

MODEL_CONFIG = "model_config.json"
TRAIN_CONFIG = "train_config.json"
EXPERIMENT = "experiment.json"  # what marks a folder of aiayn.experiment's, whose runs are its rows'
LOG = "log.jsonl"
PLOT = "loss.png"
DATA = "data"
CHECKPOINTS = "checkpoints"
STEP = "step_{:08d}"
_STEP_NAME = re.compile(r"step_(\d{8,})")
FINAL = "model"
AVERAGED = "averaged"
ATTENTION = "attention"
DEMO_RESULT = "demo.json"  # the demo's figures (demo-N-verses.json where fewer verses were scored)
ROW_RESULT = "result.json"  # a Table 3 row's figures (aiayn.experiment)
LOCK = WORK_LOCK  # no other command's --force replaces a folder that holds it (aiayn.files)

PathLike = Union[str, Path]


class RunDir:
    """The paths of one run folder, and the reading and writing of its files."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self.started_before: Optional[bool] = None  # whether `lock` found the folder's lock already there

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    model_config = property(lambda self: self.path / MODEL_CONFIG)
    train_config = property(lambda self: self.path / TRAIN_CONFIG)
    log = property(lambda self: self.path / LOG)
    plot = property(lambda self: self.path / PLOT)
    data = property(lambda self: self.path / DATA)
    final = property(lambda self: self.path / FINAL)
    averaged = property(lambda self: self.path / AVERAGED)
    attention = property(lambda self: self.path / ATTENTION)
    checkpoint_root = property(lambda self: self.path / CHECKPOINTS)

    # -- configs ----------------------------------------------------------------------------

    def has_configs(self) -> bool:
        return self.model_config.is_file()

    def configs(self) -> tuple[ModelConfig, TrainConfig]:
        """The model and training configs the run was started with."""
        values = []
        for path in (self.model_config, self.train_config):
            try:
                values.append(read_json(path))
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.path} is not a run folder: {path.name} is missing") from None
        try:
            return ModelConfig.from_dict(values[0]), TrainConfig.from_dict(values[1])
        except ValueError as error:
            raise ValueError(f"{self.path}: {error}") from None

    def write_configs(self, model_config: ModelConfig, train_config: TrainConfig) -> None:
        write_json(self.train_config, dataclasses.asdict(train_config))
        write_json(self.model_config, model_config.to_dict())

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """The finished checkpoints, oldest first (unfinished ones are hidden temporary folders).
        Only names that are a step (step_N), by step: a user's copy beside them (step_N.best,
        found in review) is no checkpoint, so neither averaged, nor resumed from, nor pruned."""
        if not self.checkpoint_root.is_dir():
            return []
        steps = {p: int(match[1]) for p in self.checkpoint_root.iterdir() if (match := _STEP_NAME.fullmatch(p.name))}
        return sorted((p for p in steps if p.is_dir()), key=steps.get)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoint_root / STEP.format(step)

    def save_checkpoint(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        trainer_state: dict, keep_last: int = 5) -> Path:
        """Write checkpoints/step_N atomically, with the run's tokenizer, then delete all but the
        newest `keep_last`."""
        folder = self.checkpoint(step)
        write_checkpoint(folder, model, optimizer, {**trainer_state, "step": step}, self.path)
        for old in self.checkpoints()[:-keep_last]:
            discard_dir(old)  # a kill midway leaves hidden litter, not a checkpoint without its weights (found in review)
        return folder

    def save_final(self, model: torch.nn.Module, tokenizer=None, step: Optional[int] = None) -> None:
        """RUN_DIR/model: the weights as a model folder with the tokenizer, replaced whole; `step`,
        the training step they are of, in their file (`model_dir` tells a stale model/ by it)."""
        def build(folder: Path) -> None:
            save_model(model, folder, step)
            if tokenizer is not None:
                tokenizer.save(folder)

        atomic_dir(self.final, build, force=True)

    # -- the writer and its leftovers -------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The run's writer lock (train, experiment, demo): RUN_DIR/.lock, which stays, and marks
        the folder as a run's. A start that fails before writing anything (an unknown corpus, a
        vocabulary too large, a refusal) leaves no lock, nor a folder of its own, behind: a folder
        holding only the lock would be in the way, and one of the user's would pass for a run's."""
        new, emptied = not self.path.exists(), False
        found = (self.path / LOCK).exists()
        if self.started_before is None:  # an outer lock of this start (demo, then train) said it first (found in review)
            self.started_before = found
        held = set() if new else {path.name for path in self.path.iterdir()}
        try:
            with writer_lock(self.path / LOCK, self.path):
                try:
                    yield
                except BaseException:
                    if not found and {path.name for path in self.path.iterdir()} - {LOCK} == held:
                        (self.path / LOCK).unlink()  # while held: a writer waiting on it takes a new one
                        emptied = new
                    raise
        finally:
            if emptied:
                try:
                    self.path.rmdir()
                except OSError:  # another writer has begun in it since
                    pass

    def check_start(self, resume: bool) -> None:
        """Never train over a run, a finished or interrupted one or an imported model, by
        accident. A folder that holds only a tokenizer (a start that failed) is not a run. The
        folders a run writes are checked writable before any step (found in review: a read-only
        checkpoints/ was found at the first save, and the steps before it lost)."""
        for folder in (self.path, self.checkpoint_root, self.final):
            check_writable(folder)
        if self.final.exists() and not self.checkpoints():  # --resume would be refused: say what works
            raise ValueError(f"{self.path} holds a model but no checkpoint to resume (an imported model?); "
                             f"fine-tune it with --init-from {self.path} and another --out")
        if resume:
            if not self.has_configs():  # a mistyped folder would otherwise start a new run
                raise ValueError(f"{self.path} holds no run to resume (no {MODEL_CONFIG}); leave out --resume "
                                 "to start one there")
            return
        held = [path.name for path in (self.checkpoint_root, self.final, self.log) if path.exists()]
        if held:
            raise ValueError(f"{self.path} already holds a run ({held[0]}); pass --resume or choose another --out")
        if (self.path / EXPERIMENT).exists():  # its rows share its DATA, which a run would make anew (found in review)
            raise ValueError(f"{self.path} holds a Table 3 experiment ({EXPERIMENT}); choose another --out")
        # What a start writes, found where no start has been (no lock): the user's own files, which
        # the run would replace (found in review: a loss.png and configs were, said to be an earlier start's).
        started = self.started_before if self.started_before is not None else (self.path / LOCK).exists()
        if not started and (theirs := [name for name in (MODEL_CONFIG, TRAIN_CONFIG, PLOT, *TOKENIZER_FILES)
                                       if (self.path / name).exists()]):
            raise ValueError(f"{self.path} holds {', '.join(theirs)}, which a new run there would replace, and no "
                             f"earlier start of one ({LOCK}); choose another --out")
        self.started_before = True  # this start's own files, from here on (the Trainer checks again)

    def remove_litter(self) -> list[Path]:
        """Delete what an interrupted write left: the hidden temporary files and folders of
        `atomic_write`, `atomic_dir` and `write_checkpoint` (`.NAME.*.tmp`, `.step_*`), each
        output's as its next writer would (`files.remove_leftovers`). Returns what was removed."""
        found = []
        for folder in (self.path, self.final, self.checkpoint_root):
            if folder.is_dir():
                found += [p for p in folder.iterdir() if p.name.startswith(".") and (
                    p.name.endswith(".tmp") or (folder == self.checkpoint_root and p.name.startswith(".step_")))]
        return remove_leftovers(found)

    # -- the log ----------------------------------------------------------------------------

    def read_log(self, echo: Callable[[str], None] = print) -> list[dict]:
        return read_log(self.log, echo)

    def append_log(self, record: dict) -> None:
        with naming(self.log), open(self.log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def keep_log_until(self, step: int, echo: Callable[[str], None] = print) -> None:
        """Drop the records after `step`: those steps are about to be trained again, and a log
        never holds one step twice."""
        if self.log.exists():
            kept = [r for r in self.read_log(echo) if r["step"] <= step]
            atomic_text(self.log, "".join(json.dumps(r) + "\n" for r in kept))

    def plot_losses(self) -> None:
        plot_losses(self.read_log(echo=lambda _: None), self.plot)

    # -- inference --------------------------------------------------------------------------

    def stale_final(self, found: list[Path]) -> bool:
        """Whether `model/` is of an earlier step than the newest of the checkpoints `found`; a
        model/ that records no step (imported, or saved before steps were kept) is the run's."""
        step = saved_step(self.final)
        return bool(found) and step is not None and int(_STEP_NAME.fullmatch(found[-1].name)[1]) > step

    def model_dir(self) -> Path:
        """The folder to translate with: the final `model/`, else the newest checkpoint, and that
        also where it is of a later step than `model/`: a run that stopped, was resumed, and was
        killed before it wrote model/ again (found in review: the first stop's was taken)."""
        found = self.checkpoints()
        if (self.final / CONFIG).is_file() and not self.stale_final(found):
            return self.final
        if found:
            return found[-1]
        if not self.path.exists():
            raise FileNotFoundError(f"no such model or run folder: {self.path}")
        for folder in (self.path, self.final):  # half a model folder: the file it lacks (found in review: unsaid)
            if (has := [name for name in (CONFIG, WEIGHTS) if (folder / name).is_file()]) and len(has) == 1:
                lacks = WEIGHTS if has == [CONFIG] else CONFIG
                raise FileNotFoundError(f"{folder} lacks {lacks} (it holds {has[0]}): a model folder holds both")
        if (self.path / EXPERIMENT).exists():  # (found in review: said as any folder)
            raise FileNotFoundError(_give_a_row(self.path))
        if self.path.is_file():  # a path one level too deep (found in review: said as any folder)
            raise FileNotFoundError(f"{self.path} is a file, not a model or run folder" + (
                f": give the model folder that holds it, {self.path.parent}" if (self.path.parent / CONFIG).is_file() else ""))
        if self.path.name == CHECKPOINTS and (steps := RunDir(self.path.parent).checkpoints()):
            raise FileNotFoundError(f"{self.path} holds a run's checkpoints: give the run, {self.path.parent}, or one "
                                    f"of them, e.g. {steps[-1]}")
        raise FileNotFoundError(f"{self.path} is neither a model folder nor a run folder with a model or checkpoints")


def read_log(path: PathLike, echo: Callable[[str], None] = print) -> list[dict]:
    """The records of a log.jsonl. A line that is not a JSON record (the last line cut short by a
    kill) is skipped with a note naming the file and line, so a run can always resume."""
    path = Path(path)
    records = []
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a record with a step")
        except ValueError:
            echo(f"note: {path}, line {number} is not a log record (cut short?); skipped")
            continue
        records.append(record)
    return records


def resolve_model_dir(path: PathLike) -> Path:
    """A model folder (config.json + model.safetensors) from a path that is one, or a run folder
    (its final `model/`, else its newest checkpoint)."""
    check_path(path, "a model or run folder")  # (found by an interop hunt: pathlib's "expected str, bytes or ...")
    path = Path(path)
    if (path / CONFIG).is_file() and (path / WEIGHTS).is_file():
        return path
    return RunDir(path).model_dir()


def languages_of(path: PathLike) -> tuple[Optional[str], Optional[str]]:
    """(source, target) language of the model at `path` (a run folder, or a model folder or
    checkpoint inside one), as its run's data recorded them; (None, None) where nothing says. A
    model of a tokenizer other than the run's is not the run's (found by an interop hunt: an
    opus-mt-de-fr imported into a run's folder was served and packaged as the run's en → es)."""
    path = Path(path).resolve()
    own = [file.read_bytes() for file in tokenizer_files(path)]
    for folder in (path, path.parent, path.parent.parent):
        theirs = [file.read_bytes() for file in tokenizer_files(folder) or tokenizer_files(folder / DATA)]
        if own and theirs and folder != path and own != theirs:
            continue
        sources = [folder / DATA / "manifest.json", folder / TRAIN_CONFIG]
        for source in sources:
            try:
                values = read_json(source)
            except (OSError, ValueError):
                continue
            if source.name == TRAIN_CONFIG and isinstance(values, dict) and isinstance(values.get("data"), str):
                sources.append(Path(values["data"]) / "manifest.json")  # trained with --data DIR (as given to it)
            if isinstance(values, dict) and values.get("src_lang") and values.get("tgt_lang"):
                named = [str(values[key]) for key in ("src_lang", "tgt_lang")]
                # A TSV's column names, where its languages were not given, are not languages.
                return tuple(None if lang == unnamed else lang for lang, unnamed in zip(named, UNNAMED))
    return None, None


def tokenizer_folder(model_dir: Path, path: PathLike) -> Path:
    """Where the tokenizer of the model at `path` is: its model folder's, else the run folder's."""
    return model_dir if has_tokenizer(model_dir) else Path(path)


def model_inputs(path: PathLike) -> list[Path]:
    """What loading the model at `path` reads, its model folder first, then its tokenizer's files:
    what no output of a command that loads it may replace (`files.refuse_to_replace`; the rest
    of a run, `run_files`, is kept from every output)."""
    model_dir = resolve_model_dir(path)
    return [model_dir, *tokenizer_files(tokenizer_folder(model_dir, path))]


def run_files(path: PathLike) -> list[Path]:
    """The files of the run folder that `path` is or lies in (a model or checkpoint of it): its
    configs and the other records at its top (the demo's and a Table 3 row's figures), log, data,
    checkpoints, final and averaged models and tokenizer, which hours of training made and no
    command's --force may replace (`aiayn average` may replace the averaged model). None where
    `path` belongs to no run."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):  # RUN/checkpoints/step_N/FILE is three levels down (found in a misuse hunt)
        run = RunDir(folder)
        if run.has_configs():  # found in review: translate --output RUN/averaged/model.safetensors --force wrote it
            records = [run.model_config, run.train_config, *sorted(folder.glob("demo*.json")), folder / ROW_RESULT]
            return [*records, run.log, run.plot, run.data, run.checkpoint_root, run.final, run.averaged,
                    *tokenizer_files(folder)]  # not an OUTPUT.partial.json: a stopped translate resumes
    return []


def load_for_inference(path: PathLike, device: Union[str, torch.device] = "cpu"):
    """(model in eval mode, tokenizer) from a model folder, a checkpoint or a run folder; the
    tokenizer is the model folder's, else the run folder's. A run training meanwhile deletes all
    but its newest checkpoints: one deleted while it was read is looked up again from a run folder,
    and said as such of a checkpoint given (found in review: "no config.json", "cut short")."""
    for _ in range(3):
        model_dir = resolve_model_dir(path)
        try:
            model = Transformer.load(model_dir, device).eval()
            tokenizer = load_tokenizer(tokenizer_folder(model_dir, path))
        except (OSError, ValueError):
            if model_dir.exists() or model_dir == Path(path) and model_dir.parent.name != CHECKPOINTS:
                raise
            if model_dir == Path(path):
                raise ValueError(f"{model_dir} was deleted while it was read: a run training in {model_dir.parent.parent} "
                                 "keeps only its newest checkpoints (--keep-last); read a copy, or its model/ when it "
                                 "ends") from None
            continue
        check_vocabulary(tokenizer, model.config)
        return model, tokenizer
    raise ValueError(f"the newest checkpoint of {path} was deleted three times while it was read: a run is training "
                     "there; read a copy, or its model/ when it ends")


def stderr_note(text: str) -> None:
    """A note to the user, as every command writes them: one line on stderr."""
    print(f"aiayn: note: {text}", file=sys.stderr)


def said_model_dir(path: PathLike, note: Callable[[str], None] = stderr_note) -> Path:
    """`resolve_model_dir`, saying which checkpoint a run folder gives where it has no final
    model, or one older than its newest checkpoint (the exports too: found in review)."""
    model_dir = resolve_model_dir(path)
    if model_dir.parent.name == CHECKPOINTS and Path(path).resolve() != model_dir.resolve():
        run = RunDir(path)
        if (run.final / CONFIG).is_file():
            note(f"{path}: its {FINAL}/ is of step {saved_step(run.final)}, older than its newest checkpoint (a resumed "
                 f"run still training, or killed before it wrote {FINAL}/ again): using {model_dir.name}")
        else:
            note(f"{path} has no {FINAL}/ (a run in progress?): using its newest checkpoint, {model_dir.name}")
    return model_dir


def pinned_model_dir(path: PathLike, note: Callable[[str], None]) -> Path:
    """The model folder `path` names, looked up once for a command that reads it more than once
    (its digest, then its weights; a server, then its workers), where a run training meanwhile
    writes newer checkpoints (found in review: a translation's record named one checkpoint and its
    lines came from the next; a server's workers decoded with another than the one it said). Says
    which checkpoint a run folder without a final model gives."""
    model_dir = said_model_dir(path, note)
    return model_dir if has_tokenizer(model_dir) else Path(path)  # (else the run folder's tokenizer, found from it)


def check_vocabulary(tokenizer, config: ModelConfig) -> None:
    """A model has one embedding row per token of its tokenizer: a model of more rows would pad with
    a real token in an export, one of fewer would be handed ids it has no row for."""
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model {config.vocab_size}")
    check_special_ids(tokenizer, config)


# The ids a model shares with its tokenizer; not bos_id, which only starts the decoder (BOS = pad
# is Marian's zero start, aiayn.marian).
SPECIAL_IDS = ("pad_id", "eos_id", "unk_id")


def check_special_ids(tokenizer, config: ModelConfig) -> None:
    """The model's padding, EOS and unknown ids are its tokenizer's: another pad_id would mask real
    pieces out of attention and the loss (found in review: --pad-id 3 trained so)."""
    for name in SPECIAL_IDS:
        if getattr(tokenizer, name) != getattr(config, name):
            raise ValueError(f"the model's {name} is {getattr(config, name)} but its tokenizer's is "
                             f"{getattr(tokenizer, name)}; a model takes its special ids from its tokenizer")


def _check_average_output(directories: list[Path], out: PathLike, force: bool) -> None:
    """An average replaces no checkpoint, model or record of a run but the run's averaged model."""
    runs = [RunDir(Path(directory).resolve().parent.parent) for directory in directories]  # of RUN/checkpoints/step_N
    kept = {*run_files(out), *(path for run in runs for path in run_files(run.path))} - {run.averaged.resolve() for run in runs}
    refuse_to_replace(out, force, inputs=directories, folder=True, kept=kept)


def average_checkpoints(directories: list[Path], out: PathLike, force: bool = False) -> None:
    """§6.1: a model whose weights are the mean of the checkpoints' (summed in float64), written
    as a model folder with the tokenizer of the newest checkpoint (atomically; an existing `out`
    only with `force`). One checkpoint is loaded at a time beside the float64 sums: about four
    copies of the model in memory at the most, however many are averaged."""
    if isinstance(directories, (str, Path)):  # (found in review: a path was read character by character)
        raise ValueError("average_checkpoints takes a list of checkpoint folders, not one path")
    if not directories:  # was an IndexError
        raise ValueError("average_checkpoints needs at least one checkpoint folder")
    check_path(out, "the output folder")
    directories = [Path(directory) for directory in directories]  # (str paths failed after the averaging)
    _check_average_output(directories, out, force)  # (found by a misuse hunt: with force=True the API replaced them)
    architecture, config = read_config(directories[-1])
    cls = {c.__name__: c for c in (models.Transformer, models.EncoderModel, models.DecoderModel)}.get(architecture)
    if cls is None:  # found in review: any name in aiayn.model was looked up (an AttributeError)
        raise ValueError(f"{directories[-1]} holds a {architecture!r}, not a Transformer, EncoderModel or DecoderModel")
    pieces = [path.read_bytes() for path in tokenizer_files(directories[-1])]
    total: dict[str, torch.Tensor] = {}
    for directory in directories:
        if read_config(directory) != (architecture, config):
            raise ValueError(f"{directory} holds another model than {directories[-1]}; cannot average")
        # The same sizes, other pieces: a checkpoint of another run (found by a misuse hunt: averaged)
        if (own := [path.read_bytes() for path in tokenizer_files(directory)]) and pieces and own != pieces:
            raise ValueError(f"{directory} has another tokenizer than {directories[-1]}: its embeddings are of other "
                             "pieces; cannot average")
        for name, tensor in load_model(cls, directory).state_dict().items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():  # (found by a misuse hunt: a NaN model)
                raise ValueError(f"{directory}: {name} holds values that are not finite (NaN or inf); cannot average it")
            total[name] = total[name].add_(tensor) if name in total else tensor.double()  # in place: one float64 copy
    model = cls(config)
    model.load_state_dict({name: value.div_(len(directories)) for name, value in total.items()})

    def build(folder: Path) -> None:
        save_model(model, folder)
        # The newest checkpoint's, else the run folder's (found in review: a checkpoint without
        # one gave a model folder without one, said nowhere).
        if not any(copy_tokenizer(source, folder) for source in (directories[-1], directories[-1].parent.parent)):
            raise ValueError(f"{directories[-1]} holds no tokenizer, nor does its run folder: the model would have none")

    atomic_dir(out, build, force)


def _kept_by(run: RunDir) -> int:
    """How many checkpoints the run keeps, as its train_config.json records (§6.1 averages as many:
    5 for base, 20 for big; found in review: a big run was averaged over 5); 5 where it says none."""
    try:
        return run.configs()[1].keep_last
    except (OSError, ValueError):
        return TrainConfig.keep_last


def _give_a_row(experiment: Path) -> str:
    """What a command that reads one run says of a Table 3 experiment given instead (its rows are runs)."""
    return f"{experiment} is a Table 3 experiment: give one of its rows, e.g. {experiment / 'base'}"


def average_last(options: AverageOptions, echo: Callable[[str], None] = print) -> None:
    """`aiayn average`: the mean of a run's last `options.last` checkpoints (if not given, as many
    as the run keeps: §6.1's 5 for base, 20 for big), or
    of those of `options.steps`, into `options.out`, under the output's lock, never over one of
    the checkpoints it reads."""
    run = RunDir(options.run_dir)
    found = run.checkpoints()
    if not found:
        given = Path(options.run_dir)
        inside = given.name == CHECKPOINTS and RunDir(given.parent).checkpoints()  # the run's checkpoints/ given
        raise ValueError(f"{given} is a file, not a run folder" if given.is_file() else  # (found in review: "no such")
                         f"no such run folder: {given}" if not given.is_dir() else
                         f"{given} is a run's checkpoints folder: give the run folder, {given.parent}" if inside else
                         _give_a_row(given) if (given / EXPERIMENT).exists() else f"no checkpoints in {given}")
    if options.steps is not None and options.last is not None:
        raise ValueError("give --last (the last checkpoints) or --steps (those of given steps), not both")
    last = options.last or _kept_by(run)
    chosen = found[-last:] if options.steps is None else [run.checkpoint(step) for step in sorted(set(options.steps))]
    if missing := [path.name for path in chosen if path not in found]:
        kept = ", ".join(path.name.split("_")[-1].lstrip("0") or "0" for path in found)
        raise ValueError(f"{options.run_dir} has no checkpoint {', '.join(missing)}; it keeps those of steps {kept}")
    _check_average_output(chosen, options.out, options.force)  # before the output's lock is taken beside it
    if options.steps is None and len(chosen) < last:
        kept = f"{len(found)} checkpoints; averaging those" if len(found) > 1 else "1 checkpoint; averaging it alone"
        stderr_note(f"{options.run_dir} keeps {kept}")  # as every command's notes (found by a misuse hunt: on stdout)
    with output_lock(options.out):
        try:
            average_checkpoints(chosen, options.out, force=options.force)
        except (ValueError, OSError):
            if gone := [path.name for path in chosen if not path.exists()]:  # found in review, beside a live run
                raise ValueError(f"{', '.join(gone)} went away while being read: a run training in {options.run_dir} keeps "
                                 "only its last --keep-last checkpoints; average again, or once it stops") from None
            raise
    echo(f"averaged {', '.join(p.name for p in chosen)} into {options.out}")
