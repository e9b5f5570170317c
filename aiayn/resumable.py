"""An output written line by line as its work is done, which a run stopped part of the way
through continues: `aiayn translate --output OUTPUT` (and `parse`) write OUTPUT.partial as each
chunk is translated, record beside it what the lines translate, and `--resume` goes on from the
last line recorded. Written through aiayn.files: never over an input, one writer at a time."""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from aiayn.files import (file_sha256, missing_parents, naming, output_lock, read_json, refuse_to_replace, remove_empty,
                         remove_unfinished, write_json)


def _complete_lines(partial: Path, most: Optional[int] = None) -> int:
    """The number of whole lines in an interrupted output, at `most` if given; a line cut short,
    and the lines after the first `most`, are removed. Fewer than `most` cuts nothing: the caller
    refuses such a partial, which stays as it was."""
    data = partial.read_bytes()
    end = data.rfind(b"\n") + 1
    if most is not None and (whole := data.count(b"\n", 0, end)) < most:
        return whole
    if most is not None and whole > most:
        end = 0
        for _ in range(most):
            end = data.index(b"\n", end) + 1
    if end < len(data):
        with open(partial, "r+b") as handle:
            handle.truncate(end)
    return data.count(b"\n", 0, end)


def _digest(path: str) -> Optional[str]:
    """The input's SHA-256; None for a pipe given by name (`<(...)`, a FIFO), which has no digest of
    its own: read for one, it was read up (found in review). Its lines are checked as stdin's are."""
    if os.path.exists(path) and not os.path.isfile(path):
        return None
    try:
        return file_sha256(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {path}") from None


class PartialOutput:
    """An output file written as it is translated: lines go to OUTPUT.partial as each chunk is
    done, and OUTPUT.partial becomes OUTPUT when all are. OUTPUT.partial.json records what the
    lines translate: the input (its SHA-256) and `settings` (the model's weights' SHA-256 and the
    decoding settings), and after each write the number of lines written and the SHA-256 of the
    input lines they translate, so that an input that has no digest of its own (stdin) is checked
    too. An interrupted run leaves OUTPUT.partial, which `resume` continues after its last line
    the record vouches for, with the same input, model and settings only: lines of two models,
    two beams or two inputs in one file would pass for one translation. The output is never the
    model it reads (`model`: its files, `run.model_inputs`), nor a folder or a device. `loose`
    settings are recorded too, and a resume may change them: `changed` names those it did, with
    what the partial was made with. Each input line gives `per_line` output lines (n-best).
    `older`: the values of settings that records from before they were kept were made with."""

    def __init__(self, output: str, input: Optional[str], resume: bool, force: bool,
                 model: Sequence[Path] = (), settings: Optional[dict] = None, kept: Sequence[Path] = (),
                 loose: Optional[dict] = None, per_line: int = 1, older: Optional[dict] = None) -> None:
        self.final = Path(output)
        self.per_line = per_line
        self.partial = self.final.with_name(self.final.name + ".partial")
        self.record = self.final.with_name(self.final.name + ".partial.json")
        if self.final.is_dir():
            raise ValueError(f"{output} is a folder; --output names a file")
        self._made = missing_parents(self.final)
        # Refused before the lock makes a folder or a file (found in review: inside an input, too),
        # and checked again under it.
        self._refuse(input, resume, force, model, kept)
        # One writer at a time, from the first check to the rename: two mixed their lines in one
        # file (a second run told to --resume the first's live partial; found in review).
        self._lock = ExitStack()
        try:
            self._lock.enter_context(output_lock(self.final))
            self._open(input, resume, force, model, settings or {}, kept, loose or {}, older or {})
        except BaseException:
            self._release()
            raise

    def _refuse(self, input: Optional[str], resume: bool, force: bool, model: Sequence[Path], kept: Sequence[Path]) -> None:
        inputs = ([] if input in (None, "-") else [input]) + list(model)
        refuse_to_replace(self.final, force or resume, inputs, kept=kept)  # before anything is read or written
        for written in (self.partial, self.record):  # written before the output is: never an input either
            refuse_to_replace(written, True, inputs, kept=kept)
            if written.is_symlink():  # written through, it would fill the file it names (found in review)
                raise ValueError(f"{written} is a symbolic link (to {os.readlink(written)}); the translation is "
                                 "written there as a file of its own: remove the link")

    def _open(self, input: Optional[str], resume: bool, force: bool, model: Sequence[Path], settings: dict,
              kept: Sequence[Path], loose: dict, older: dict) -> None:
        self._refuse(input, resume, force, model, kept)
        remove_unfinished(self.record)  # a record a kill left half rewritten (found in review: it stayed for good)
        digest = None if input in (None, "-") else _digest(input)
        self.skip, self.changed = 0, []
        self.nothing_to_resume = resume and not self.partial.exists() and not self.final.exists()
        if resume and self.partial.exists():
            kept = read_json(self.record) if self.record.exists() else {}
            if digest is not None and kept.get("input_sha256") not in (None, digest):
                raise ValueError(f"{self.partial} translates another input than {input} (its digest differs); "
                                 "--resume needs the same input, --force starts over")
            # A record from before a setting was kept was made with its `older` value (found in
            # review: read as any), and one from before settings were kept says nothing of the rest.
            changed = [name for name, value in settings.items() if kept.get(name, older.get(name, value)) != value]
            if changed:  # each named with what the partial was made with: an older default reads so (--min-len 0)
                was = " and ".join(f"{name} ({kept.get(name, older.get(name))})" if name.startswith("--") else name
                                   for name in changed)
                raise ValueError(f"{self.partial} was translated with another {was}; "
                                 "--resume needs the same model and settings, --force starts over")
            # (a partial without a record, from before records were kept, gets one from now on)
            self.changed = [f"{name} ({kept[name]})" for name, value in loose.items() if kept.get(name, value) != value]
            self._record = {"input": input or "-", "input_sha256": digest, **kept, **settings, **loose}
            self.skip = self._resume_at(kept.get("lines"))
        elif resume and self.final.exists():
            raise ValueError(f"{self.final} is complete: nothing to resume (--force translates again)")
        elif not force and self.partial.exists():
            raise ValueError(f"{self.partial} holds an interrupted translation; pass --resume to continue it "
                             "or --force to start over")
        try:  # as every folder output makes the folders above it
            self.final.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError as error:  # a file where a folder of the path is needed
            raise ValueError(f"{error.filename} is a file, not a folder") from None
        self.handle = open(self.partial, "ab" if self.skip else "wb")  # an unwritable output fails here, before decoding
        self._read, self._lines_read = hashlib.sha256(), 0  # the input lines read so far
        if not self.skip:
            self._record = {"input": input or "-", "input_sha256": digest, **settings, **loose}
            self._keep_record()
        self.written = self.skip

    def _resume_at(self, recorded: Optional[int]) -> int:
        """The input lines to pass over: those of the partial's whole lines, cut back to the
        `recorded` ones (lines written after the record was last updated are translated again); a
        record from before lines were counted vouches for every whole line."""
        most = None if recorded is None else recorded * self.per_line
        lines = _complete_lines(self.partial, most)
        if most is not None and lines < most:  # nothing was cut
            raise ValueError(f"{self.partial} holds {lines} lines but its record says {most}: it was changed "
                             "after it was written; --force starts over")
        return lines // self.per_line  # (a partial without a record is from before --n-best: one line a line)

    def lines(self, lines: Iterable[str], name: str) -> Iterator[str]:
        """The input's lines after the `skip` already translated, each line read added to the
        digest the record keeps. The lines passed over must hash as they did when they were
        translated (the check that stdin, which has no digest of its own, gets); a record from
        before that digest was kept checks their number only."""
        for line in lines:
            self._read.update(line.encode("utf-8") + b"\n")
            self._lines_read += 1
            if self._lines_read == self.skip and self._record.get("lines_sha256") not in (None, self._read.hexdigest()):
                raise ValueError(f"{name} is not the input {self.partial} translates (its first {self.skip} lines "
                                 "differ); --resume needs the same input, --force starts over")
            if self._lines_read > self.skip:
                yield line
        if self._lines_read < self.skip:  # a stream is known to be too short only once it ends
            raise ValueError(f"{name} has {self._lines_read} lines, fewer than the {self.skip} to pass over: "
                             "--resume needs the same input")

    def _keep_record(self) -> None:
        write_json(self.record, {**self._record, "lines": self._lines_read, "lines_sha256": self._read.hexdigest()})

    def write(self, text: str, lines: int) -> None:
        """Append `lines` output lines, those of every input line read so far (a stream reads no
        line past those it writes next), then record them: the lines first, on disk, so that the
        record never vouches for lines a crash lost."""
        with naming(self.partial):
            self.handle.write(text.encode("utf-8"))
            self.handle.flush()
            os.fsync(self.handle.fileno())
        self.written += lines
        if self.written != self._lines_read:
            raise RuntimeError(f"{self.written} output lines for {self._lines_read} input lines read")
        self._keep_record()

    def abandon(self, interrupted: bool) -> None:
        """After a failure: nothing written is removed (with the folders made for it, left
        empty); what was is kept for --resume."""
        try:
            self.handle.close()
        except OSError:  # the lines a full disk did not take, tried again: the record vouches for those written
            pass
        if not self.written:
            self.partial.unlink(missing_ok=True)
            self.record.unlink(missing_ok=True)
        elif self.written > self.skip or interrupted:
            done = f"{self.written} finished lines" if self.per_line == 1 else \
                f"the {self.per_line} lines of each of {self.written} finished input lines"  # (n-best)
            print(f"aiayn: note: {done} are in {self.partial}; rerun with --resume to continue",
                  file=sys.stderr)
        self._release()

    def _release(self) -> None:
        """Let the lock go, then remove the folders made for an output that has no line in them."""
        self._lock.close()
        if not self.final.exists() and not self.partial.exists():
            remove_empty(self._made)

    def finish(self) -> None:
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.partial, self.final)
        self.record.unlink(missing_ok=True)
        self._release()
