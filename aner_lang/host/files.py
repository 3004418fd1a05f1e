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

Every write of a file a user names goes through here too (`write_json`, `save_adapter`,
`export_gguf` and the other exporters, `train`'s checkpoints folder and event log), under one
rule:

* An existing file, or a folder that holds anything, is never replaced unless the call says
  `overwrite: true`; and a protected path (the model's own base file or folder, and anything
  inside it) is never written, whatever the call says.
* A file appears whole or not at all: it is written to a temporary sibling, flushed to disk, and
  then linked into place (which fails if the name was taken meanwhile) or, with `overwrite`,
  renamed over the old one. The temporary file is removed if anything fails.
* Every file written gets the permissions a new file gets from the process's umask (0644 under
  the usual 022), and every folder those of a new folder (0755), whichever library wrote it: some
  write theirs private (safetensors writes 0600), which would leave one file of an exported
  folder unreadable to the people its siblings are readable to.
* A path is written as the kind it already is: a folder never replaces a file nor goes inside
  one, a file never replaces a folder (E-FILE-KIND naming the path in the way, before anything
  is written).

The limits are the bounds `docs/security.md` states; each caller passes the one for its kind of
file. This module imports nothing heavy, so the front end uses it too.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from aner_lang.problems.errors import AnerRuntimeError

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


def check_name(path: str | Path) -> None:
    """A path no file can have (one with a NUL character) is an error, not a Python exception."""
    if "\0" in str(path):
        raise _fail(repr(str(path)), "a path cannot contain a NUL character", "E-FILE-NAME")


def resolve(path: str, base: Path) -> Path:
    """A path as a script names it, made absolute: relative to the script's folder `base`
    (absolute paths and `~` as the user's home are kept), the same for a run and its checks."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def regular_size(path: str | Path, limit: int | None = None) -> int:
    """The size of the regular file `path` (links followed), at most `limit` bytes when given;
    for a reader that opens the file itself (a memory map, a streaming parser)."""
    check_name(path)
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
    if limit is not None and st.st_size > limit:
        raise _too_large(path, st.st_size, limit)
    return st.st_size


def _too_large(path: str | Path, size: int, limit: int) -> AnerRuntimeError:
    return _fail(
        path,
        f"is {size:,} bytes, more than the {limit:,} bytes allowed for this kind of file",
        "E-FILE-TOO-LARGE",
    )


def read_bytes(path: str | Path, limit: int) -> bytes:
    """The whole file, if it is a regular file of at most `limit` bytes."""
    regular_size(path, limit)
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
    regular_size(path, limit)
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


def _inside(path: Path, protected: Iterable[str | Path]) -> Path | None:
    """The protected path that `path` is, or lies inside, if any (links resolved)."""
    target = path.resolve()
    for p in protected:
        guard = Path(p).resolve()
        if target == guard or guard in target.parents:
            return guard
    return None


def check_target(
    path: str | Path,
    *,
    overwrite: bool,
    protected: Iterable[str | Path] = (),
    folder: bool = False,
) -> Path:
    """`path` checked as the target of a write (see the module docstring): a file, or with
    `folder` a folder. Returns it as a Path."""
    check_name(path)
    out = Path(path)
    guard = _inside(out, protected)
    if guard is not None:
        raise _fail(
            out,
            f"is the model's own {'file' if guard.is_file() else 'folder'} {guard}"
            + ("" if guard == out.resolve() else " or inside it")
            + ", which Aner never writes to",
            "E-FILE-PROTECTED",
            "write the result somewhere else",
        )
    if not os.path.lexists(out):
        return out
    if out.is_dir() != folder:
        kind = "a folder" if out.is_dir() else "a file"
        raise _fail(
            out, f"is {kind}, not the {'folder' if folder else 'file'} to write", "E-FILE-KIND"
        )
    if not overwrite and (not folder or any(out.iterdir())):
        raise _fail(
            out,
            f"already exists{' and is not empty' if folder else ''}",
            "E-FILE-EXISTS",
            "pass `overwrite: true` to replace it, or choose another path",
        )
    return out


def write_file(
    path: str | Path, data: bytes, *, overwrite: bool, protected: Iterable[str | Path] = ()
) -> Path:
    """Write `data` as the file `path` (parent folders created), whole or not at all, under the
    rule of the module docstring."""
    out = Path(path)
    try:
        with replacing(path, overwrite=overwrite, protected=protected) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        raise _fail(out, f"cannot be written: {exc.strerror or exc}", "E-IO") from None
    return out


@contextmanager
def replacing(
    path: str | Path,
    *,
    overwrite: bool,
    protected: Iterable[str | Path] = (),
    folder: bool = False,
) -> Iterator[Path]:
    """The temporary path to write `path` into (with `folder`, a fresh empty folder), checked
    first and published when the block ends without error, under the rule of the module
    docstring; removed if anything fails."""
    out = check_target(path, overwrite=overwrite, protected=protected, folder=folder)
    make_parent(out)
    with staged(out) as tmp:
        if folder:
            tmp.mkdir()
        yield tmp
        settle_modes(tmp)
        publish(tmp, out, overwrite=overwrite)


def settle_modes(path: Path) -> None:
    """Give the file `path`, or the folder `path` and everything in it, the permissions of a new
    file or folder under the umask (the rule of the module docstring). Links are left alone."""
    mask = _umask()
    found = [(str(path), path.is_dir())]
    for root, dirs, names in os.walk(path):  # nothing when `path` is a file
        found += [(os.path.join(root, d), True) for d in dirs]
        found += [(os.path.join(root, n), False) for n in names]
    for item, is_folder in found:
        if not os.path.islink(item):
            os.chmod(item, (0o777 if is_folder else 0o666) & ~mask)


def _umask() -> int:
    """The process's umask: read from /proc where Linux shows it (setting it to read it back
    would briefly change it for every thread), else set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_parent(out: Path) -> None:
    """Create the folder `out` goes in (and its parents), under `make_folder`'s rule."""
    make_folder(out.parent)


def make_folder(folder: str | Path) -> Path:
    """Create the folder `folder` to write into, and the folders above it: E-FILE-KIND naming
    the path in the way when it or a folder above it exists as something else (a file), an
    error naming it if creating fails otherwise. Returns it as a Path."""
    check_name(folder)
    out = Path(folder)
    for p in (out, *out.parents):
        if not os.path.lexists(p):
            continue
        if not p.is_dir():
            inside = "" if p == out else f" ({out} would be created inside it)"
            raise _fail(p, f"is a file, not a folder{inside}", "E-FILE-KIND")
        break
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(out, f"cannot be created as a folder: {exc.strerror or exc}", "E-IO") from None
    return out


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A temporary sibling path for `out` (a hidden name no other writer uses), removed on the way
    out if it still exists: after a failure, or a file linked into place."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        yield tmp
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.lexists(tmp):
            tmp.unlink()


def publish(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """Move the finished `tmp` (a file or a folder) to `out`. Without `overwrite` the name must
    still be free: a file is hard-linked (atomic, and it fails if the name was taken meanwhile),
    a folder renamed only if `out` is absent or an empty folder."""
    if overwrite:
        if tmp.is_dir() and out.is_dir():
            for item in tmp.iterdir():
                os.replace(item, out / item.name)
        else:
            os.replace(tmp, out)
        return
    taken = _fail(out, "already exists", "E-FILE-EXISTS", "it appeared while Aner was writing it")
    if tmp.is_dir():
        try:
            os.rename(tmp, out)  # replaces an empty folder; fails on one that is not
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise taken from None
            raise
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise taken from None
    except OSError:  # a file system without hard links: the check above has to do
        if os.path.lexists(out):
            raise
        os.rename(tmp, out)
