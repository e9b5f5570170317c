"""How failures are said to a user: one line about what they gave, not the system's wording.

The command line (aiayn.cli) ends every user mistake with `aiayn: error: ...`; these say the
failures that reach it from the system: a path that is a folder or a file where the other is
needed, a folder that does not exist, an allocation that failed.
"""

from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's notice, `kill`), unwinding as Ctrl-C does so that what was done is
    kept and said; the command line then exits 143 (128 + SIGTERM), as a process that SIGTERM ended,
    where Ctrl-C gives 130."""


class ClosedStdout(io.TextIOBase):
    """sys.stdout of a process started with its standard output closed (`aiayn info >&-`), where
    Python has None: print() then drops every line and the command exits 0, and a translation's
    write is an AttributeError (found in review). A write here fails as a user's mistake."""

    def write(self, text: str) -> int:
        raise OSError("standard output is closed (>&-): the results have nowhere to go; leave it open, "
                      "or give an output file where the command takes one")


def os_error_message(error: OSError) -> str:
    """An error from the system about a path, said of the path the user gave: "F is a folder, not
    a file" rather than "[Errno 21] Is a directory: 'F'". Where the error does not tell which was
    wanted (a missing path), it says no more than it knows. Others as they are."""
    if error.filename is None or error.strerror is None or error.filename2 is not None:
        return str(error)
    path = Path(os.fsdecode(error.filename))
    if error.errno == errno.EISDIR:
        return f"{path} is a folder, not a file"
    if error.errno == errno.ENOTDIR:  # a file stands where the path needs a folder
        file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if file is not None:
            return f"{file} is a file, not a folder"
    if error.errno == errno.EEXIST and path.exists() and not path.is_dir():  # a folder made, or a file made anew
        return f"{path} already exists, as a file"
    if error.errno == errno.ENAMETOOLONG:  # (found in review: said as the system says it)
        return f"{path}: a name in this path is longer than the file system allows"
    if error.errno == errno.ENOENT and not path.parent.is_dir():
        return f"no such folder: {path.parent}"
    if error.errno == errno.ENOENT:
        return f"no such file or folder: {path}"
    return f"{path}: {error.strerror}"


def command_line_message(error: Exception) -> str:
    """What `aiayn: error:` says of a user's mistake, on one line: an OSError as `os_error_message`
    says it, and without the API's word for an option ("pass --force (in Python: force=True)"),
    which a command's user has no use for."""
    message = os_error_message(error) if isinstance(error, OSError) else str(error)
    return " ".join(re.sub(r" \(in Python: [^)]*\)", "", message).split())


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says an allocation failed: a GPU's OutOfMemoryError, Python's MemoryError, or
    the RuntimeError PyTorch's CPU allocator raises (its message the only sign of it)."""
    import torch  # here, not on top: the command line parses its flags before PyTorch loads (aiayn.cli)

    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(error)


def ask_for_less(command: str) -> str:
    """What to do about an out-of-memory error of `command`: the options it has that make it need
    less (found in review: every command but five was told translate's), else free memory."""
    decoding = ("a smaller --batch-tokens (a --resume may change it), or a smaller --extra-len or --max-output-len, "
                "batch or model")
    less = {"train": "a smaller --max-tokens (--accumulate N keeps the batch) or model",
            "demo": "a smaller --preset", "experiment": "a smaller --scale",
            "serve": "a smaller --max-batch-mib, fewer --workers",
            "attention": "a shorter --sentence or a smaller --max-tokens",
            "translate": decoding, "parse": decoding,
            "preprocess": "a smaller --sample-sentences or fewer --workers"}.get(command)
    return f"ask for less: {less}" if less else "close other programs, or run it on a machine with more memory"


def one_process(command: str) -> None:
    """`demo` and `experiment table3` write one folder from one process (found by a misuse hunt:
    under torchrun the second rank was refused the first's lock, and the first hung in the
    process group's rendezvous until torchrun killed it 30 s later)."""
    if (processes := environment_count("WORLD_SIZE", 1)) > 1:
        raise ValueError(f"aiayn {command} runs in one process, not under torchrun's {processes}; train with several "
                         "processes by `torchrun ... -m aiayn train`")


def environment_count(name: str, default: int) -> int:
    """A count a launcher sets in the environment (torchrun's WORLD_SIZE, LOCAL_RANK): a value
    that is not one is said by its name (found in review: "invalid literal for int()")."""
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"the environment's {name} is {value!r}, not a whole number (torchrun sets it; "
                         f"unset it to run one process)") from None
