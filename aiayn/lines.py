"""Lines of text files, as corpora, inputs and references are read: UTF-8, split on "\\n" only
(so that counts agree with `wc -l` and aligned files stay aligned), `.xz` decompressed, read as
they are consumed; a two-column TSV of (source, target); two files aligned line by line. Every
error names the file, and the line where there is one."""

from __future__ import annotations

import errno
import itertools
import lzma
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

Pair = tuple[str, str]


def iter_lines(handle: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream split on "\\n" only (a trailing "\\r" dropped), so that the
    line count agrees with `wc -l` whatever separators (\\f, U+2028, ...) a line holds. Invalid
    UTF-8 is an error naming `name` and the line, and so is a text of one line that holds a
    "\\r": lines ended by "\\r" alone (classic Mac OS), which would be one sentence (found in
    review: a corpus of such files was one pair, silently)."""
    number, line = 0, ""
    for number, raw in enumerate(handle, start=1):
        # UTF-16 without its mark (found by a misuse hunt: read as text, NULs dropped, or "latin1" advised)
        if number == 1 and raw[:2] not in (b"\xff\xfe", b"\xfe\xff") and raw.count(0) * 3 >= len(raw) > 2:
            order = "BE" if raw[:1] == b"\x00" else "LE"
            raise ValueError(f"{name} looks like UTF-16 without a byte-order mark (a third of its first line is NUL "
                             f"bytes); convert it to UTF-8, e.g. iconv -f UTF-16{order} -t UTF-8")
        try:
            # utf-8-sig on line 1: a byte-order mark is not part of the first sentence.
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\n").removesuffix("\r")
        except UnicodeDecodeError as error:
            if number == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # (found in review: "invalid start byte")
                raise ValueError(f"{name} is UTF-16 (it begins with UTF-16's byte-order mark); convert it to UTF-8, "
                                 "e.g. iconv -f UTF-16 -t UTF-8") from None
            raise ValueError(f"{name}, line {number}: invalid UTF-8 ({error.reason} at byte {error.start}); convert "
                             "it to UTF-8, e.g. iconv -f latin1 -t UTF-8 for Latin-1") from None
        yield line
    if number == 1 and "\r" in line:
        raise lone_carriage_returns(name)


def lone_carriage_returns(name: str) -> ValueError:
    return ValueError(f"{name} ends its lines with \\r alone (classic Mac OS), so it is one line by \\n; "
                      "convert it first, e.g. tr '\\r' '\\n'")


def file_lines(path: Path) -> Iterator[str]:
    """`iter_lines` of a file, .xz decompressed, read as it is consumed. Errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    opener = lzma.open if path.suffix == ".xz" else open
    try:
        with opener(path, "rb") as handle:
            yield from iter_lines(handle, str(path))
    except (lzma.LZMAError, EOFError) as error:
        raise ValueError(f"{path} is not a complete .xz file: {error}") from None


def read_lines(path: Union[str, Path]) -> list[str]:
    """The lines of a UTF-8 text file (.xz decompressed), split on "\\n" only, so that the
    sentence count of aligned files agrees with `wc -l`. Errors name the file and line."""
    lines = list(file_lines(Path(path)))
    if not lines:
        raise ValueError(f"{path} is empty")
    return lines


def tsv_pairs(path: Union[str, Path]) -> Iterator[Pair]:
    number = 0
    for number, line in enumerate(file_lines(Path(path)), start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            if number == 1 and "\r" in line:  # its pairs, one line by \n: said as such, not as columns (found in review)
                raise lone_carriage_returns(str(path))
            raise ValueError(f"{path}, line {number}: " + (  # (found in review: a blank line was "found 1")
                "a blank line, where a pair is expected (source, a tab, target)" if not line.strip() else
                f"expected 2 tab-separated columns (source, target), found {len(columns)}"))
        yield columns[0], columns[1]
    if number == 0:
        raise ValueError(f"{path} is empty")


def aligned_pairs(src_path: Path, tgt_path: Path) -> Iterator[Pair]:
    """(line of src_path, line of tgt_path), read side by side; files of unequal length are an
    error, raised when the longer one ends."""
    src_count = tgt_count = 0
    for source, target in itertools.zip_longest(file_lines(src_path), file_lines(tgt_path)):
        src_count += source is not None
        tgt_count += target is not None
        if source is not None and target is not None:
            yield source, target
    if src_count != tgt_count:
        raise ValueError(f"{src_path} has {src_count} lines but {tgt_path} has {tgt_count}; "
                         "parallel files must be aligned line by line")
    if src_count == 0:
        raise ValueError(f"{src_path} is empty")


def check_input(path: Optional[str]) -> None:
    """Refuse an input file (not stdin: none or "-") that is a folder or missing, without opening
    it: a command may say so before other checks (a named pipe opened and closed would lose what
    its writer sent)."""
    if path is None or path == "-":
        return
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")


def open_input(path: Optional[str]) -> tuple[BinaryIO, str]:
    """(binary handle, name for messages) of an input file, checked by `check_input`, or of stdin
    for none or "-"."""
    if path is None or path == "-":
        return sys.stdin.buffer, "stdin"
    check_input(path)
    return open(path, "rb"), path


# Control characters (Unicode's Cc) but the spaces among them (tab, line breaks, U+0085): no
# sentence holds them, and encoded they are byte pieces that the model reads as words (found by
# a misuse hunt: "\x01\x02 God" was not translated as "God" is). And U+FEFF, a byte-order mark
# inside a file made by joining files (`cat a b`; found by a misuse hunt: learnt as a piece).
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ufeff]")


def visible(text: str) -> str:
    """`text` stripped and without control characters, or "" where no character of it is
    visible (format characters only: a zero-width space). Such a text is translated as empty, as
    a blank one is: encoded, it is byte pieces, from which the model invents a sentence (found in
    review). Corpora are read through it too, so that training sees what translation will."""
    if not isinstance(text, str):  # (found by a misuse hunt: the regex's TypeError, for Translator.stream's lines)
        raise TypeError(f"lines are strings, not {type(text).__name__}: {text!r}"[:200])
    text = _CONTROLS.sub("", text).strip()
    return text if any(character.isprintable() and not character.isspace() for character in text) else ""
