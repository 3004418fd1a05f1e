"""What `aner check` can tell about a call before the script runs (`Builtin.precheck`).

Each function takes the arguments of one call that are known statically (literals and defaults,
enum members as their names; an argument computed at run time is absent) and the script's
directory, and returns the failures the call would certainly meet, each with the parameter whose
argument is at fault. The runtime raises the same errors (same codes, same rules: data rows go
through `aner_lang.records` in both), so a script that checks cleanly here fails later only on
what could not be known. Nothing here imports torch; a data file is read only up to its first
`FIRST_ROWS` rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aner_lang import files, gpus
from aner_lang.errors import AnerRuntimeError
from aner_lang.model_paths import missing_model
from aner_lang.preference_records import FeedbackFormat, PairFormat
from aner_lang.records import Format, RowFormat, jsonl_format, rows

Failures = list[tuple[str, AnerRuntimeError]]
FIRST_ROWS = 8
"""Rows of a literal data file `aner check` reads to check their fields."""
ROW_CHECKED = (".jsonl", ".ndjson", ".txt")
"""Data files whose first rows are checked (tables are only checked to exist)."""


def _path(args: Mapping[str, object], script_dir: Path) -> Path | None:
    path = args.get("path")
    if not isinstance(path, str):
        return None
    p = Path(path).expanduser()
    return p if p.is_absolute() else script_dir / p


def _data_file(path: Path, fmt: RowFormat[object] | None) -> Failures:
    """The file exists, and its first rows have this format's fields (when the format is known)."""
    try:
        if fmt is None or path.suffix.lower() not in ROW_CHECKED:
            files.regular_size(path, files.DATA_LIMIT)
            return []
        for row in rows(path, FIRST_ROWS):
            fmt.record(row)
    except AnerRuntimeError as e:
        return [("path", e)]
    return []


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
    return [] if path is None else _data_file(path, PairFormat())


def load_feedback(args: Mapping[str, object], script_dir: Path) -> Failures:
    path = _path(args, script_dir)
    return [] if path is None else _data_file(path, FeedbackFormat())


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
    without a CUDA GPU."""
    found: Failures = []
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
