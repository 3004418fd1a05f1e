"""What the checks before a run can tell about a call (`Builtin.precheck`, `Param.path`).

Each precheck function takes the arguments of one call that are known statically (literals and
defaults, enum members as their names; an argument computed at run time is absent, and so is a
path the script may write before the call runs) and the script's directory, and returns the
failures the call would certainly meet, each with the parameter whose argument is at fault.
`aner_lang.check.environment` decides which calls are certain to run and so may be refused. The
runtime raises the same errors (same codes, same rules: data rows go through `aner_lang.datafiles.records`
in both), so a script that checks cleanly here fails later only on what could not be known.

Nothing here imports torch. A data file is read whole, a row at a time (memory bounded by one
row, size by `files.DATA_LIMIT`), so a bad row anywhere is found before any model loads; the
result is kept for the file as it is (path, size, modification time), so checking again, as an
editor does on every change, does not read an unchanged file again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from aner_lang.datafiles.preference_records import FeedbackFormat, PairFormat
from aner_lang.datafiles.records import Format, check_records, jsonl_format
from aner_lang.host import files, gpus
from aner_lang.host.chat_template import syntax_error
from aner_lang.host.model_paths import missing_model
from aner_lang.problems.errors import AnerRuntimeError

Failures = list[tuple[str, AnerRuntimeError]]
ROW_CHECKED = (".jsonl", ".ndjson", ".txt")
"""Data files whose rows are checked (tables are only checked to exist)."""
PAIRS, FEEDBACK = PairFormat(), FeedbackFormat()
RowCheck = Format | PairFormat | FeedbackFormat
"""The formats a data file's rows are checked in (hashable: results are kept by format)."""
CHECKED_FILES = 64
"""Data files whose check results are kept (by path, size and modification time)."""


def _path(args: Mapping[str, object], script_dir: Path) -> Path | None:
    path = args.get("path")
    return files.resolve(path, script_dir) if isinstance(path, str) else None


def _data_file(path: Path, fmt: RowCheck | None) -> Failures:
    """The file exists, and every row has this format's fields (when the format is known)."""
    try:
        if fmt is None or path.suffix.lower() not in ROW_CHECKED:
            files.regular_size(path, files.DATA_LIMIT)
            return []
        files.check_name(path)
        try:
            st = os.stat(path)
            stamp: tuple[int, int, int] | None = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:  # missing or unreadable: `check_records` says which
            stamp = None
        failure = _rows_failure(str(path), stamp, fmt)
    except AnerRuntimeError as e:
        return [("path", e)]
    return [] if failure is None else [("path", failure)]


@lru_cache(maxsize=CHECKED_FILES)
def _rows_failure(
    path: str, stamp: tuple[int, int, int] | None, fmt: RowCheck
) -> AnerRuntimeError | None:
    """The first failure of the file's rows in `fmt` (`records.check_records`), or None; cached
    by the file's `stamp` (None for a path that is not a regular file, which fails at once)."""
    try:
        check_records(Path(path), fmt)
    except AnerRuntimeError as e:
        return e
    return None


def load_data(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    if path is None:
        return []
    options = ("format", "field", "prompt_field", "completion_field", "template")
    known = all(k in args for k in options)
    fmt = Format(*(args[k] for k in options)) if known else None  # type: ignore[arg-type]
    return _data_file(path, fmt)


def load_jsonl(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    if path is None:
        return []
    options = ("field", "prompt_field", "completion_field")
    if not all(k in args for k in options):
        return _data_file(path, None)
    try:
        fmt = jsonl_format(*(args[k] for k in options))  # type: ignore[arg-type]
    except AnerRuntimeError as e:
        return [("prompt_field", e)]
    return _data_file(path, fmt)


def load_pairs(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    return [] if path is None else _data_file(path, PAIRS)


def load_feedback(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    return [] if path is None else _data_file(path, FEEDBACK)


def read_text(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    if path is None:
        return []
    try:
        files.regular_size(path, files.TEXT_LIMIT)
    except AnerRuntimeError as e:
        return [("path", e)]
    return []


PACKAGE_SCHEME = "pypi:"


def load_model(args: Mapping[str, object], script_dir: Path) -> Failures:
    """A model path that names nothing (``pypi:`` paths are left to the run), `device: cuda`
    without a CUDA GPU, a `chat_template` that is not Jinja."""
    found: Failures = []
    template = args.get("chat_template")
    if isinstance(template, str) and (bad := syntax_error(template)) is not None:
        found.append(("chat_template", bad))
    path = _path(args, script_dir)
    if path is not None and not str(args["path"]).startswith(PACKAGE_SCHEME) and not path.exists():
        found.append(
            (
                "path",
                missing_model(str(args["path"]), path),
            )
        )
    if args.get("device") == "cuda" and not gpus.detect():
        found.append(
            (
                "device",
                AnerRuntimeError(
                    "device: cuda, but this machine has no CUDA GPU (no driver, or no device)",
                    code="E-NO-CUDA",
                    notes=("use device: auto (the GPU where there is one) or device: cpu",),
                ),
            )
        )
    return found


def profile(args: Mapping[str, object], script_dir: Path) -> Failures:
    """`kernel: fused` without a CUDA GPU."""
    if args.get("kernel") == "fused" and not gpus.detect():
        return [
            (
                "kernel",
                AnerRuntimeError(
                    "kernel: fused needs a CUDA GPU, and this machine has none",
                    code="E-KERNEL-UNAVAILABLE",
                    notes=("use kernel: auto (fused where it can run) or kernel: host_tiled",),
                ),
            )
        ]
    return []


def output(path: Path, *, folder: bool, overwrite: object) -> AnerRuntimeError | None:
    """Why a call cannot write `path` (a file, or with `folder` a folder) as it stands now, as
    the call itself would say (`files.check_target`): an existing target without `overwrite`
    (when `overwrite` is not known, only what fails either way: a file where a folder is needed
    or the other way round)."""
    try:
        files.check_target(path, overwrite=overwrite is not False, folder=folder)
    except AnerRuntimeError as e:
        return e
    return None
