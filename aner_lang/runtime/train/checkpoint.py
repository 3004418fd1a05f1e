"""Exact, crash-safe training checkpoints: safetensors + a JSON manifest with a sha256 per file.

Layout under a checkpoint directory ``dir``::

    dir/latest.json                 -> {"checkpoint": "update-000002-<id>", "manifest_sha256": ...}
    dir/update-000002-<id>/tensors.safetensors   every tensor of the TrainState (never the base)
    dir/update-000002-<id>/state.json            TrainState.to_json()
    dir/update-000002-<id>/manifest.json         identity + {file: {bytes, sha256}}

Why this shape: a checkpoint is first written completely into a temporary sibling directory
(each file fsynced, then the directory), renamed into place, and only then published by atomically
replacing ``latest.json`` (temp file, fsync, rename, directory fsync). A crash at any moment
leaves ``latest.json`` naming a complete, verified checkpoint: the previous one is deleted only
after the new pointer is durable. Loading re-hashes every byte and refuses, naming the mismatch,
a truncated or altered file, a different base model (GGUF sha256, see `fingerprint`), a
different profile or a different kernel identity.

The state object follows the trainer state contract of docs/internals.md: ``to_tensors()`` and
``to_json()`` (with ``"profile"`` and ``"kernel_identity"`` keys, and ``"base": {"path": ...}``
naming the GGUF the adapter was built on).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.adapters import adapter_from_state
from aner_lang.runtime.io.fingerprint import fingerprint
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train.state import TrainState

FORMAT = "aner-checkpoint"
VERSION = 1
POINTER = "latest.json"
TENSORS = "tensors.safetensors"
STATE = "state.json"
MANIFEST = "manifest.json"
_PREFIX = "update-"


class CheckpointState(Protocol):
    """What `save` needs from a training state (the trainer's TrainState)."""

    def to_tensors(self) -> dict[str, torch.Tensor]: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint read back from disk (what an Aner `Checkpoint` value is)."""

    folder: Path
    updates: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    identity: dict[str, Any]

    @property
    def path(self) -> str:
        return str(self.folder)

    @property
    def method(self) -> str:
        return str((self.meta.get("adapter") or {}).get("method", ""))

    @property
    def base_sha256(self) -> str | None:
        return self.identity.get("base_fingerprint")

    def __repr__(self) -> str:
        return f"Checkpoint({self.method or 'state'} after {self.updates} updates, {self.folder})"


def _fail(directory: Path, what: str, code: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(f"checkpoint {directory}: {what}", code=code, notes=notes)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=True).encode("utf-8")


def _identity(meta: dict[str, Any], base_path: str | Path | None) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed: base, profile, kernel."""
    path = base_path if base_path is not None else (meta.get("base") or {}).get("path")
    return {
        "base_path": str(path) if path is not None else None,
        "base_fingerprint": fingerprint(path) if path is not None else None,
        "profile": meta.get("profile"),
        "kernel_identity": meta.get("kernel_identity"),
    }


def save(
    directory: str | Path,
    state: CheckpointState,
    *,
    base_path: str | Path | None = None,
    keep: int = 1,
) -> Path:
    """Write `state` as the new latest checkpoint under `directory`; return its folder.

    `keep` older checkpoints are kept besides the new one (they are removed only after the new
    one is published). Never writes the frozen base: only what `state.to_tensors()` holds.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    meta = state.to_json()
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.to_tensors().items()}
    files = {TENSORS: st_save(tensors), STATE: _json_bytes(meta)}
    updates = int((meta.get("counters") or {}).get("updates", 0))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "updates": updates,
        "identity": _identity(meta, base_path),
        "files": {
            n: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()
        },
    }
    manifest_bytes = _json_bytes(manifest)
    manifest_sha = hashlib.sha256(manifest_bytes).hexdigest()
    name = f"{_PREFIX}{updates:06d}-{manifest_sha[:12]}"
    final = root / name
    if not final.is_dir():  # the same name means byte-identical content already on disk
        tmp = root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for n, b in files.items():
            _write_durable(tmp / n, b)
        _write_durable(tmp / MANIFEST, manifest_bytes)
        _fsync_dir(tmp)
        os.replace(tmp, final)
        _fsync_dir(root)
    pointer_tmp = root / f".{POINTER}.tmp-{os.getpid()}"
    _write_durable(pointer_tmp, _json_bytes({"checkpoint": name, "manifest_sha256": manifest_sha}))
    os.replace(pointer_tmp, root / POINTER)
    _fsync_dir(root)
    _prune(root, name, keep)
    return final


def _prune(root: Path, current: str, keep: int) -> None:
    """Remove leftovers of interrupted writes and all but `keep` older checkpoints."""
    for p in root.glob(f".{_PREFIX}*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    older = sorted(
        (p for p in root.glob(f"{_PREFIX}*") if p.is_dir() and p.name != current),
        key=lambda p: p.name,
    )
    for p in older[: max(0, len(older) - keep)]:
        shutil.rmtree(p, ignore_errors=True)


def _read_json(directory: Path, path: Path, data: bytes | None = None) -> dict[str, Any]:
    try:
        obj = json.loads(data if data is not None else path.read_bytes())
    except FileNotFoundError:
        raise _fail(
            directory,
            f"{path.name} is missing",
            "E-CKPT-MISSING",
            "is this a directory written by train(..., checkpoints: dir)?",
        ) from None
    except (OSError, ValueError) as e:
        raise _fail(directory, f"{path.name} is not valid JSON ({e})", "E-CKPT-CORRUPT") from None
    if not isinstance(obj, dict):
        raise _fail(directory, f"{path.name} is not a JSON object", "E-CKPT-CORRUPT")
    return obj


def _verified_bytes(directory: Path, folder: Path, name: str, expected: dict[str, Any]) -> bytes:
    try:
        data = (folder / name).read_bytes()
    except FileNotFoundError:
        raise _fail(directory, f"{folder.name}/{name} is missing", "E-CKPT-MISSING") from None
    if len(data) != expected.get("bytes"):
        raise _fail(
            directory,
            f"{folder.name}/{name} is truncated or extended: "
            f"{len(data)} bytes, the manifest says {expected.get('bytes')}",
            "E-CKPT-TRUNCATED",
        )
    if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
        raise _fail(
            directory,
            f"{folder.name}/{name} is corrupted: its sha256 does not match the manifest",
            "E-CKPT-CORRUPT",
        )
    return data


def _check(directory: Path, what: str, recorded: Any, given: Any, code: str) -> None:
    if recorded != given:
        raise _fail(
            directory,
            f"{what} differs from the one it was written with",
            code,
            f"checkpoint: {json.dumps(recorded, sort_keys=True)}",
            f"now:        {json.dumps(given, sort_keys=True)}",
        )


def _locate(root: Path) -> tuple[Path, bytes]:
    """The checkpoint folder `root` means, and its manifest's bytes, verified.

    `root` is either a checkpoint directory (its ``latest.json`` names the folder and the
    manifest's sha256) or one ``update-*`` folder inside it (whose name ends with the first 12
    hex digits of its manifest's sha256), so an earlier checkpoint can be resumed too.
    """
    if not root.is_dir():
        raise _fail(root, "no such directory", "E-CKPT-MISSING")
    if (root / MANIFEST).is_file() and root.name.startswith(_PREFIX):
        folder, want = root, root.name.rsplit("-", 1)[-1]
    else:
        pointer = _read_json(root, root / POINTER)
        name = str(pointer.get("checkpoint", ""))
        folder, want = root / name, str(pointer.get("manifest_sha256"))
        if not name.startswith(_PREFIX) or "/" in name or not folder.is_dir():
            raise _fail(
                root,
                f"{POINTER} names a checkpoint that does not exist: {name!r}",
                "E-CKPT-MISSING",
            )
    data = (folder / MANIFEST).read_bytes() if (folder / MANIFEST).is_file() else None
    if data is None:
        raise _fail(root, f"{folder.name}/{MANIFEST} is missing", "E-CKPT-MISSING")
    if not hashlib.sha256(data).hexdigest().startswith(want):
        raise _fail(
            root,
            f"{folder.name}/{MANIFEST} is corrupted: its sha256 does not match "
            f"{POINTER if folder != root else 'the folder name'}",
            "E-CKPT-CORRUPT",
        )
    return folder, data


def has_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` is a checkpoint directory (or folder) that was written to."""
    root = Path(directory)
    return (root / POINTER).is_file() or (root / MANIFEST).is_file()


def load(
    directory: str | Path,
    *,
    base_path: str | Path | None = None,
    profile: dict[str, Any] | None = None,
    kernel_identity: str | None = None,
) -> Checkpoint:
    """Read and verify the latest checkpoint under `directory` (or the folder `directory`).

    Every file's size and sha256 are checked against the manifest, and the manifest against the
    pointer. When given, `base_path` (its GGUF fingerprint), `profile` and `kernel_identity`
    must equal what the checkpoint recorded.
    """
    root = Path(directory)
    folder, manifest_bytes = _locate(root)
    manifest = _read_json(root, folder / MANIFEST, manifest_bytes)
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise _fail(
            root,
            f"unsupported format {manifest.get('format')!r} version {manifest.get('version')!r}",
            "E-CKPT-FORMAT",
        )
    entries = manifest.get("files") or {}
    tensor_bytes = _verified_bytes(root, folder, TENSORS, entries.get(TENSORS, {}))
    meta = _read_json(
        root, folder / STATE, _verified_bytes(root, folder, STATE, entries.get(STATE, {}))
    )
    identity = manifest.get("identity") or {}
    if base_path is not None:
        _check(
            root,
            "the base model (sha256 of the GGUF)",
            identity.get("base_fingerprint"),
            fingerprint(base_path),
            "E-CKPT-BASE",
        )
    if profile is not None:
        _check(root, "the training profile", identity.get("profile"), profile, "E-CKPT-PROFILE")
    if kernel_identity is not None:
        _check(
            root,
            "the kernel identity",
            identity.get("kernel_identity"),
            kernel_identity,
            "E-CKPT-KERNEL",
        )
    return Checkpoint(
        folder=folder,
        updates=int(manifest.get("updates", 0)),
        tensors=st_load(tensor_bytes),
        meta=meta,
        identity=identity,
    )


def latest(directory: str | Path) -> Checkpoint | None:
    """The verified latest checkpoint under `directory`, or None when none was written yet."""
    return load(directory) if has_checkpoint(directory) else None


def resume(
    directory: str | Path, model: Any = None, profile: Any = None, otherwise: Any = None
) -> Any:
    """The adapter of the latest checkpoint under `directory`, ready for `train` to continue.

    `model` must be the base it was trained on (checked by GGUF sha256); without it the base is
    loaded from the recorded path and storage. A given `profile` must equal the recorded one.
    With `otherwise`, a directory holding no checkpoint yet gives `otherwise` back, so one
    script both starts and continues a run.
    """
    root = Path(directory)
    if otherwise is not None and not has_checkpoint(root):
        return otherwise
    ck = load(root, profile=profile.to_json() if profile is not None else None)
    base = ck.meta.get("base") or {}
    if model is None:
        if not ck.identity.get("base_path"):
            raise _fail(
                root,
                "it does not record its base model",
                "E-CKPT-BASE",
                "pass the base: resume(dir, model: base)",
            )
        model = load_model(ck.identity["base_path"], storage=base.get("storage", "float32"))
    elif ck.base_sha256 is not None:
        _check(
            root,
            "the base model (sha256 of the GGUF)",
            ck.base_sha256,
            fingerprint(model.path),
            "E-CKPT-BASE",
        )
    try:
        state = TrainState.from_parts(ck.tensors, ck.meta)
    except AnerRuntimeError as e:
        raise _fail(root, e.message, e.code) from None
    return adapter_from_state(model, state)


def resume_builtin(
    ctx: Any, *, dir: str, model: Any = None, profile: Any = None, otherwise: Any = None
) -> Any:
    """Builtin `resume`: `dir` is relative to the script."""
    return resume(ctx.resolve_path(dir), model, profile, otherwise)


def latest_builtin(ctx: Any, *, dir: str) -> Checkpoint | None:
    """Builtin `latest_checkpoint`: `dir` is relative to the script."""
    return latest(ctx.resolve_path(dir))
