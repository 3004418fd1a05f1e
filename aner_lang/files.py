"""Reading the files a user names: bounded, regular files only, errors that name file and limit.

Every read of a user's file goes through here (scripts and their imports, `read_text`, datasets,
checkpoints' JSON, adapter configs, the language server's imports), so one set of rules holds
everywhere:

* Only regular files are read. A FIFO, a device (`/dev/zero`, `/dev/urandom`) or a socket would
  block or never end; they are refused before opening (symbolic links are followed first, so a
  link to a device is refused too).
* A size limit is checked before reading, and again while reading (a file may grow): a larger
  file is an error naming the file, its size and the limit, never a silent truncation.
* Text is UTF-8, exactly as in the file: no newline translation (`\\r\\n` stays), and invalid
  bytes are an error naming the file, line and column.

The limits are the bounds `docs/security.md` states; each caller passes the one for its kind of
file. This module imports nothing heavy, so the front end uses it too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from aner_lang.errors import AnerRuntimeError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SCRIPT_LIMIT = 8 * MiB
"""An Aner script or an imported file."""
TEXT_LIMIT = 256 * MiB
"""`read_text` of a script, a template, a JSON config."""
DATA_LIMIT = 64 * GiB
"""A dataset file (read line by line, never whole)."""
LINE_LIMIT = 16 * MiB
"""One line of a JSON-lines dataset."""


def _fail(path: str | Path, what: str, code: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(f"{path}: {what}", code=code, notes=notes)


def _size_of_regular(path: str | Path) -> int:
    try:
        st = os.stat(path)  # follows symbolic links: a link to a device is a device
    except FileNotFoundError:
        raise _fail(path, "no such file", "E-FILE-MISSING") from None
    except NotADirectoryError:
        raise _fail(
            path, "no such file (a part of the path is not a folder)", "E-FILE-MISSING"
        ) from None
    except OSError as exc:
        raise _fail(path, f"cannot be read: {exc.strerror}", "E-FILE-READ") from None
    if stat.S_ISDIR(st.st_mode):
        raise _fail(path, "is a folder, not a file", "E-FILE-KIND")
    if not stat.S_ISREG(st.st_mode):
        raise _fail(
            path,
            "is not a regular file (a device, a pipe or a socket), which Aner never reads",
            "E-FILE-KIND",
        )
    return st.st_size


def _too_large(path: str | Path, size: int, limit: int) -> AnerRuntimeError:
    return _fail(
        path,
        f"is {size:,} bytes, more than the {limit:,} bytes allowed for this kind of file",
        "E-FILE-TOO-LARGE",
    )


def regular_size(path: str | Path, limit: int) -> int:
    """The size of `path` if it is a regular file of at most `limit` bytes (E-FILE-* otherwise),
    for a reader that opens the file itself (pyarrow's tables)."""
    size = _size_of_regular(path)
    if size > limit:
        raise _too_large(path, size, limit)
    return size


def read_bytes(path: str | Path, limit: int) -> bytes:
    """The whole file, if it is a regular file of at most `limit` bytes."""
    size = _size_of_regular(path)
    if size > limit:
        raise _too_large(path, size, limit)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise _fail(path, f"cannot be read: {exc.strerror}", "E-FILE-READ") from None
    if len(data) > limit:
        raise _too_large(path, len(data), limit)
    return data


def decode(path: str | Path, data: bytes) -> str:
    """UTF-8 text of `data` read from `path`; a bad byte is an error at its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _fail(
            path,
            f"line {line}, column {col}: not UTF-8 text (byte 0x{data[exc.start]:02x})",
            "E-FILE-ENCODING",
        ) from None


def read_text(path: str | Path, limit: int = TEXT_LIMIT) -> str:
    """The file as UTF-8 text, exactly as written (see the module docstring)."""
    return decode(path, read_bytes(path, limit))


def lines(
    path: str | Path, limit: int = DATA_LIMIT, line_limit: int = LINE_LIMIT
) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending) of every line of a UTF-8 file, reading a line
    at a time: memory is bounded by `line_limit`, not by the file."""
    size = _size_of_regular(path)
    if size > limit:
        raise _too_large(path, size, limit)
    try:
        with open(path, "rb") as f:
            number = 0
            while True:
                raw = f.readline(line_limit + 1)
                if not raw:
                    return
                number += 1
                if len(raw) > line_limit and not raw.endswith(b"\n"):
                    raise _fail(
                        path,
                        f"line {number} is longer than {line_limit:,} bytes",
                        "E-FILE-TOO-LARGE",
                    )
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _fail(
                        path,
                        f"line {number}, column {exc.start + 1}: not UTF-8 text",
                        "E-FILE-ENCODING",
                    ) from None
                yield number, text.removesuffix("\n").removesuffix("\r")
    except OSError as exc:
        raise _fail(path, f"cannot be read: {exc.strerror}", "E-FILE-READ") from None
