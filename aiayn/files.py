"""Files that are never half-written, and outputs that are never replaced by accident: the base
every other module writes through.

- `atomic_write`, `atomic_dir`: write beside the target, fsync, rename; a crash leaves the old
  file or nothing, never half of the new one.
- `refuse_to_replace`: the one rule for outputs (replace only with --force, never an input).
- `writer_lock`, `output_lock`: one writer at a time for a folder, released by the kernel
  when its process ends, however it ends.
- JSON and SHA-256 of files, read and written the same way everywhere.

An output written line by line, which a run stopped part of the way through continues
(--resume), is aiayn.resumable's `PartialOutput`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from safetensors import SafetensorError

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def usual_mode(path: Union[str, Path], directory: bool = False) -> None:
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
        usual_mode(tmp)  # after writing: some writers (safetensors) create the file anew
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(error, (OSError, SafetensorError)):
            raise OSError(f"cannot write {path}: {' '.join(str(error).split())}") from None
        raise


# The writer lock a working folder (a training run, an experiment: aiayn.run) keeps inside it. No
# output of another command replaces such a folder, --force or not: hours of training are no
# command's output to overwrite by a mistyped --out.
WORK_LOCK = ".lock"


def refuse_to_replace(path: Union[str, Path], force: bool, inputs: Iterable[Union[str, Path]] = (),
                      folder: Optional[bool] = None, kept: Iterable[Path] = ()) -> None:
    """The one rule for outputs: writing `path` may replace something (a file, or a folder that
    is not empty) only with `force`, and never what the command reads: an output that is one of
    its `inputs`, holds one or lies inside one is refused, `force` or not, since replacing it
    would delete the input (symbolic links and `..` resolved). Nor, `force` or not, the current
    folder or one that holds it, a working folder (`WORK_LOCK`), or a file where
    the output is a folder (`folder` True) or a folder where it is a file (`folder` False): a
    mistyped --out would delete a data file. Nor what a training run keeps (`kept`: the records,
    checkpoints and models of the run the output lies in, `run.run_files`), whichever model the
    command reads. Commands call it before their work, so that the refusal comes before minutes
    of decoding rather than after."""
    if not isinstance(force, bool):  # (found by an interop hunt: force="no" replaced the output)
        raise TypeError(f"force is True or False, not {force!r}")
    path = Path(path)
    out = path.resolve()
    here = Path.cwd().resolve()
    if out == here or out in here.parents:  # replaced whole, it would take the shell's folder with it
        raise ValueError(f"{path} is {'the current folder' if out == here else 'a folder that holds the current one'}; "
                         "choose another output")
    if path.is_dir() and (run := _work_inside(path)) is not None:  # the folder, or one it holds (found in review)
        what = f"{path} is a training run or an experiment" if run == path else \
            f"{path} holds a training run or an experiment, {run}"
        raise ValueError(f"{what} (it holds {WORK_LOCK}): --force replaces outputs, never a run; choose another output")
    for source in inputs:
        read = Path(source).resolve()
        if out == read:
            raise ValueError(f"{path} is an input of this command ({source}); choose another output")
        if out in read.parents:
            raise ValueError(f"{path} holds {source}, an input of this command; choose another output")
        if read in out.parents:
            raise ValueError(f"{path} lies inside {source}, an input of this command; choose another output")
    for record in kept:  # found in review: import-hf --out RUN/averaged --force replaced another run's model
        where = "is" if out == record else "lies inside" if record in out.parents else "holds" if out in record.parents else None
        if where:
            what = "one of the records a training run keeps" if where == "is" else f"{record}, which a training run keeps"
            raise ValueError(f"{path} {where} {what}: --force replaces outputs, never a run's records, checkpoints or "
                             "models; choose another output")
    # A device or a pipe, which a rename would replace: /dev/stdout too, a link to a file (found in review).
    if path.exists() and (not (path.is_file() or path.is_dir()) or path.absolute().parts[1:2] in (("dev",), ("proc",))):
        raise ValueError(f"{path} is not a regular file or folder (a device, a pipe, a device's name); choose another output")
    if folder is not None and path.exists() and path.is_dir() != folder:
        raise ValueError(f"{path} is a {'folder' if path.is_dir() else 'file'}, and this output is a "
                         f"{'folder' if folder else 'file'}; choose another path")
    if not force and path.is_symlink() and not path.exists():  # a link to nothing is still replaced (found in review)
        raise FileExistsError(f"{path} already exists (a symbolic link to {os.readlink(path)}, which does not); "
                              "pass --force (in Python: force=True) to replace it")
    if not force and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} already exists; pass --force (in Python: force=True) to replace it"
                              + (f" whole, with all it holds: {_listing(path)}" if path.is_dir() else ""))
    _check_name_length(path)
    check_writable(out.parent)


# The most an output's name grows in the names written beside it: `atomic_write`'s temporary
# ".NAME.XXXXXXXX.tmp" (a translation's OUTPUT.partial and its record are checked by their names).
NAME_GROWS = 14


def _check_name_length(path: Path) -> None:
    """Refuse a name the files written beside the output could not have (found in review: a legal
    name of 250 bytes failed on NAME.partial after the model loaded; one of 300 was "cannot write
    in FOLDER", which can be written)."""
    most = 255
    with suppress(OSError, ValueError):
        most = os.pathconf(next(p for p in (path.absolute(), *path.absolute().parents) if p.exists()), "PC_NAME_MAX")
    if (size := len(os.fsencode(path.name))) > most - NAME_GROWS:
        raise ValueError(f"the name {path.name[:12]}...{path.name[-16:]} is {size} bytes: this file system allows {most}, "
                         f"and aiayn writes beside it under names up to {NAME_GROWS} longer; choose a shorter name")


def _listing(folder: Path, most: int = 3) -> str:
    """What a folder holds, said briefly: what --force would delete with it (found in review: a
    folder of the user's own, not an earlier output, was named only)."""
    names = sorted(entry.name + "/" * entry.is_dir() for entry in folder.iterdir())
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_writable(folder: Path) -> None:
    """Whether a file can be made in `folder` (or, while it does not exist, in the folder it would
    be made in), found by making a nameless one: permission bits do not tell (root, `chattr +i`,
    a read-only mount), and a command that writes its output last would fail after its work."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return  # a file where a folder is needed: said where the output is made
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as error:
        raise OSError(f"cannot write in {folder}: {error.strerror}") from None


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
    while True:
        try:
            lock_file.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a file where a folder of the path is needed
            file = next(path for path in lock_file.parents if path.exists() and not path.is_dir())
            raise ValueError(f"{file} is a file, not a folder") from None
        try:
            handle = open(lock_file, "a+", encoding="utf-8")
        except FileNotFoundError as error:
            if lock_file.parent.is_dir():  # (found in review: /proc, where no file is made, was tried forever)
                raise OSError(f"cannot write in {lock_file.parent}: {error.strerror}") from None
            continue  # a start that failed has just removed the folder it made (RunDir.lock)
        except OSError as error:  # a folder that cannot be written: said as `refuse_to_replace` says it
            raise OSError(f"cannot write in {lock_file.parent}: {error.strerror}") from None
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
        try:  # unbuffered: a failed write leaves nothing for close() to fail on again
            os.ftruncate(handle.fileno(), 0)
            os.pwrite(handle.fileno(), f"{os.getpid()}\n".encode(), 0)
        except OSError as error:  # a full disk (found by a fault hunt: "[Errno 28] ...", naming nothing, the lock file left)
            if remove:
                lock_file.unlink(missing_ok=True)
            raise OSError(f"cannot write in {lock_file.parent}: {error.strerror}") from None
        _held.add(lock_file)
        try:
            yield
        finally:
            _held.discard(lock_file)
            if remove:
                lock_file.unlink(missing_ok=True)


def _work_inside(folder: Path) -> Optional[Path]:
    """The first working folder (`WORK_LOCK`) at or below `folder`, as replacing it would delete
    it: links are not followed, as the deletion follows none."""
    for parent, _, files in os.walk(folder):
        if WORK_LOCK in files:
            return Path(parent)
    return None


def output_lock(out: Union[str, Path]) -> AbstractContextManager:
    """The writer lock of an output folder that is built elsewhere and renamed into place
    (`atomic_dir`, as `average` writes): a hidden `.NAME.lock` beside it, removed when done."""
    out = Path(out)
    return writer_lock(out.parent / f".{out.name}.lock", out, remove=True)


def remove_unfinished(out: Path) -> None:
    """Delete the hidden folders `atomic_dir` builds `out` in (`.NAME.XXXXXXXX.tmp`, and the old
    `out` moved aside, `.NAME.XXXXXXXX.old.tmp`), and the files `atomic_write` writes it as,
    that a writer killed mid-way left: they never load, but they take disk. A writer killed
    between moving the old `out` aside and renaming the new one in left no `out`: the old one is
    put back first (found in review: it was deleted). Only under `out`'s writer lock, so none is
    another writer's."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}(\.old)?\.tmp")  # mkdtemp's 8 random characters
    if not out.parent.is_dir():
        return
    left = [path for path in out.parent.iterdir() if pattern.fullmatch(path.name) and not path.is_symlink()]
    moved_aside = [path / out.name for path in left if path.name.endswith(".old.tmp") and (path / out.name).exists()]
    if moved_aside and not os.path.lexists(out):
        os.replace(max(moved_aside, key=lambda path: path.stat().st_mtime_ns), out)
    for path in left:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


_UNFINISHED = re.compile(r"\.(.+)\.[a-z0-9_]{8}(\.old)?\.tmp")  # what atomic_write and atomic_dir leave of OUT


def remove_leftovers(found: Sequence[Path]) -> list[Path]:
    """Delete the hidden leftovers `found` (a run's, when it starts again), and return those
    removed. Those of an output (`.OUT.XXXXXXXX.tmp`) go as its next writer's `remove_unfinished`
    clears them, under its lock: an old OUT that a writer killed between its renames moved aside
    is put back, and what another process is writing now is left to it (found by a fault hunt:
    the only copy of an `average --out RUN/averaged --force`'s old model, and the folder another
    `average` was building, were deleted as litter)."""
    removed = []
    for path in found:
        if not os.path.lexists(path):  # cleared with an earlier one of its output
            continue
        if (match := _UNFINISHED.fullmatch(path.name)) is not None:
            out = path.parent / match[1]
            try:
                with output_lock(out):
                    restored = match[2] is not None and not os.path.lexists(out) and (path / out.name).exists()
                    remove_unfinished(out)
            except ValueError:  # being written by another process: not litter
                continue
        else:
            restored = False
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if not restored:
            removed.append(path)
    return removed


def discard_dir(path: Union[str, Path]) -> None:
    """Delete the folder `path` by moving it into a hidden `.NAME.XXXXXXXX.tmp` first, so that a
    kill midway leaves litter that `remove_unfinished` (and a run's `remove_litter`) clears, never
    half a folder under its own name that would pass for a whole one."""
    path = Path(path)
    hidden = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.replace(path, hidden / path.name)
    except BaseException:
        hidden.rmdir()  # not moved (a mount point, another file system): no empty litter either
        raise
    shutil.rmtree(hidden)


def atomic_dir(path: Union[str, Path], build: Callable[[Path], None], force: bool = False) -> None:
    """Call `build(tmp_dir)` on a new hidden folder beside `path`, then rename it to `path`, so a
    crash never leaves half a folder (weights without their tokenizer). An existing `path` (but
    an empty folder) is an error unless `force`, and then it is replaced whole: no file of the
    old one stays. All under `path`'s writer lock (`output_lock`): a second writer is refused,
    not left to replace the first's output (found in review), and what a killed one left goes."""
    path = Path(path)
    refuse_to_replace(path, force, folder=True)
    with undo_new_parents(path), output_lock(path):
        _build_in_place(path, build, force)


def missing_parents(path: Union[str, Path]) -> list[Path]:
    """The folders above `path` that do not exist yet, innermost first: those its writer makes."""
    return [folder for folder in Path(path).parents if not folder.exists()]


def remove_empty(folders: Sequence[Path]) -> None:
    """Remove `folders` (innermost first) while they are empty: a writer's own, made for an output
    that did not come to be. One that holds something now stops it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


@contextmanager
def undo_new_parents(path: Union[str, Path]) -> Iterator[None]:
    """Should the block fail, remove the folders above `path` that it made (found in review: a
    failed output into a/b/c left a/b behind, empty)."""
    made = missing_parents(path)
    try:
        yield
    except BaseException:
        remove_empty(made)
        raise


def _build_in_place(path: Path, build: Callable[[Path], None], force: bool) -> None:
    """`atomic_dir`'s work, under its lock: build in a hidden folder, then rename."""
    remove_unfinished(path)
    refuse_to_replace(path, force, folder=True)  # an old `path` put back by remove_unfinished
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        usual_mode(tmp, directory=True)
        build(tmp)
        refuse_to_replace(path, force, folder=True)  # made meanwhile by a writer that takes no lock
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old.tmp", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException as error:
        if old is not None and (old / path.name).exists() and not path.exists():  # stopped between the renames
            os.replace(old / path.name, path)  # the old output back, rather than none (found in review)
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        message = str(error)
        if isinstance(error, OSError) and (str(tmp) in message or str(path) not in message):
            # The folder being written named, not its hidden stand-in (found in review: a full
            # disk or `ulimit -f` said "File too large" and no more). One that names it already
            # (a refusal to replace it) goes on as it is, its type kept.
            message = message.replace(str(tmp), str(path))
            raise OSError(message if str(path) in message else f"cannot write {path}: {message}") from None
        raise


@contextmanager
def naming(path: Union[str, Path]) -> Iterator[None]:
    """An OSError of the writes inside (a full disk, `ulimit -f`) as one line that names `path`
    (found by a fault hunt: "[Errno 27] File too large", naming nothing)."""
    try:
        yield
    except OSError as error:
        raise OSError(f"cannot write {path}: {error.strerror or error}") from None


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


def atomic_text(path: Union[str, Path], text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def file_sha256(path: Union[str, Path]) -> str:
    """The SHA-256 of a whole file."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
