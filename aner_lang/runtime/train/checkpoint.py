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

Nothing in a checkpoint directory is trusted (docs/security.md): every file is read through
`aner_lang.host.files` (regular files only, bounded: the manifest states each file's size, and no more
is read), the pointer and the manifest are checked against a schema before any of their values
is used, hashes are compared whole (never a prefix), the base model's fingerprint is required,
and the tensors must be finite. A forged checkpoint with recomputed hashes therefore still has to
be a well-formed one of the same base.

Pruning removes only what this writer made: a folder counts as a checkpoint only when its name has
the writer's form and its manifest hashes to the digest in that name, and a leftover temporary
folder only when its name has the writer's temporary form. Any other folder in the directory, a
user's own ``update-notes`` included, is never touched.

The state object follows the trainer state contract of docs/internals.md: ``to_tensors()`` and
``to_json()`` (with ``"profile"`` and ``"kernel_identity"`` keys, and ``"base": {"path": ...}``
naming the GGUF the adapter was built on).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load as st_load

from aner_lang.host import files, json_text
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters import adapter_from_state
from aner_lang.runtime.io.fingerprint import fingerprint
from aner_lang.runtime.io.tensor_file import TensorFile
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train.state import TrainState

FORMAT = "aner-checkpoint"
VERSION = 1
POINTER = "latest.json"
TENSORS = "tensors.safetensors"
STATE = "state.json"
MANIFEST = "manifest.json"
_PREFIX = "update-"
_FOLDER = re.compile(r"update-(\d{6,})-([0-9a-f]{12})")
"""A checkpoint folder's name: the update count and the first 12 hex digits of its manifest's
sha256."""
_TEMPORARY = re.compile(r"\.(update-\d{6,}-[0-9a-f]{12}|latest\.json)\.tmp-\d+")
"""A temporary folder or pointer file of an interrupted `save`."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_UPDATES = 10**12
"""More updates than any run makes (a million a day for over two thousand years)."""
JSON_LIMIT = files.TEXT_LIMIT
"""The pointer, a manifest or a state.json."""
TENSORS_LIMIT = files.DATA_LIMIT
"""A checkpoint's tensors file."""


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
    def base_sha256(self) -> str:
        return str(self.identity["base_fingerprint"])

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
    if path is None:
        raise AnerRuntimeError(
            "a checkpoint needs the path of its base model, which the state does not name",
            code="E-CKPT-BASE",
        )
    return {
        "base_path": str(path),
        "base_fingerprint": fingerprint(path),
        "profile": meta.get("profile"),
        "kernel_identity": meta.get("kernel_identity"),
    }


def _hash(chunks: Iterable[memoryview | bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def save(
    directory: str | Path,
    state: CheckpointState,
    *,
    base_path: str | Path | None = None,
    keep: int = 1,
) -> Path:
    """Write `state` as the new latest checkpoint under `directory`; return its folder.

    `keep` older checkpoints are kept besides the new one (they are removed only after the new
    one is published). Never writes the frozen base: only what `state.to_tensors()` holds. The
    tensors file is hashed on a thread of its own while it is written (hashlib and the file's
    writes let go of the interpreter lock), then read back and compared with the bytes it was
    written from before its folder is renamed into place: the folder's name comes from the
    manifest, which holds that hash, so the files are written into a temporary folder of a
    placeholder name first.
    """
    root = files.make_folder(directory)
    meta = state.to_json()
    tensors = TensorFile({k: v.detach().contiguous().cpu() for k, v in state.to_tensors().items()})
    state_bytes = _json_bytes(meta)
    updates = int((meta.get("counters") or {}).get("updates", 0))
    tmp = root / f".{_PREFIX}{updates:06d}-{secrets.token_hex(6)}.tmp-{os.getpid()}"
    tmp.mkdir()
    with ThreadPoolExecutor(max_workers=1) as pool:
        tensors_sha = pool.submit(_hash, tensors.chunks())
        _write_tensors(tmp / TENSORS, tensors)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "updates": updates,
            "identity": _identity(meta, base_path),
            "files": {
                TENSORS: {"bytes": tensors.size, "sha256": tensors_sha.result()},
                STATE: {"bytes": len(state_bytes), "sha256": _hash([state_bytes])},
            },
        }
    manifest_bytes = _json_bytes(manifest)
    _write_durable(tmp / STATE, state_bytes)
    _write_durable(tmp / MANIFEST, manifest_bytes)
    manifest_sha = hashlib.sha256(manifest_bytes).hexdigest()
    return _publish(root, f"{_PREFIX}{updates:06d}-{manifest_sha[:12]}", manifest_sha, tmp, keep)


_PIECE = 1 << 26
"""Bytes read back at a time when a written tensors file is compared (64 MiB)."""


def _write_tensors(path: Path, tensors: TensorFile) -> None:
    """Write `tensors` to `path` durably, then read it back, a piece at a time, and compare it
    with the memory it was written from (bytearray equality is one memcmp): a file that does
    not read back as written is an error here (E-CKPT-TRUNCATED, E-CKPT-CORRUPT), not at the
    resume that needs it."""
    with open(path, "wb") as f:
        tensors.write(f)
        f.flush()
        os.fsync(f.fileno())
    where = path.parent.parent
    buffer = bytearray(_PIECE)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != tensors.size:
            raise _fail(
                where,
                f"{path.name} is truncated or extended as written: {size} bytes of {tensors.size}",
                "E-CKPT-TRUNCATED",
            )
        for chunk in tensors.chunks():
            for start in range(0, len(chunk), _PIECE):
                piece = chunk[start : start + _PIECE]
                into = buffer if len(piece) == _PIECE else bytearray(len(piece))
                if f.readinto(into) != len(piece) or into != piece:
                    raise _fail(
                        where, f"{path.name} did not read back as written", "E-CKPT-CORRUPT"
                    )


def publish_copy(directory: str | Path, folder: Path) -> Path:
    """Make the checkpoint `folder` (written by `save` in another directory of the same file
    system) the latest and only checkpoint of `directory`, through hard links to its files: the
    same bytes under a second name, not a second copy. Where the file system refuses a link the
    files are copied. Returns the new folder."""
    root = files.make_folder(directory)
    manifest_sha = hashlib.sha256(files.read_bytes(folder / MANIFEST, JSON_LIMIT)).hexdigest()
    tmp = root / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if not (root / folder.name).is_dir():  # there, it is these bytes: `_publish` keeps it
        for name in (TENSORS, STATE, MANIFEST):
            try:
                os.link(folder / name, tmp / name)
            except OSError:
                shutil.copyfile(folder / name, tmp / name)
                with open(tmp / name, "rb+") as f:
                    os.fsync(f.fileno())
    return _publish(root, folder.name, manifest_sha, tmp, keep=0)


def _publish(root: Path, name: str, manifest_sha: str, tmp: Path, keep: int) -> Path:
    """Rename the filled temporary folder `tmp` to `name` under `root` (unless `name` is there:
    the same name means byte-identical content, and `tmp` goes), then point `latest.json` at it
    and prune (see the module docstring)."""
    final = root / name
    if final.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
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
    """Remove leftovers of interrupted writes and all but `keep` older checkpoints: only what
    this writer made (see the module docstring)."""
    for p in root.iterdir():
        if _TEMPORARY.fullmatch(p.name) and not p.is_symlink():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    older = sorted(p for p in root.iterdir() if p.name != current and _written_here(p))
    for p in older[: max(0, len(older) - keep)]:
        shutil.rmtree(p, ignore_errors=True)


def _written_here(folder: Path) -> bool:
    """Whether `folder` is a checkpoint folder this writer made: its name has the writer's form
    and its manifest hashes to the digest the name ends with."""
    m = _FOLDER.fullmatch(folder.name)
    if m is None or folder.is_symlink() or not folder.is_dir():
        return False
    try:
        data = files.read_bytes(folder / MANIFEST, JSON_LIMIT)
    except AnerRuntimeError:
        return False
    return hashlib.sha256(data).hexdigest()[:12] == m.group(2)


def _read_json(directory: Path, path: Path, data: bytes | None = None) -> dict[str, Any]:
    try:
        obj = json_text.loads(data if data is not None else files.read_bytes(path, JSON_LIMIT))
    except AnerRuntimeError as e:
        if e.code == "E-FILE-MISSING":
            raise _fail(
                directory,
                f"{path.name} is missing",
                "E-CKPT-MISSING",
                "is this a directory written by train(..., checkpoints: dir)?",
            ) from None
        raise _fail(directory, e.message, e.code) from None
    except ValueError as e:
        raise _fail(directory, f"{path.name} is not valid JSON ({e})", "E-CKPT-CORRUPT") from None
    if not isinstance(obj, dict):
        raise _fail(directory, f"{path.name} is not a JSON object", "E-CKPT-CORRUPT")
    return obj


def _schema_error(directory: Path, where: str, what: str) -> AnerRuntimeError:
    return _fail(
        directory,
        f"{where} is malformed: {what}",
        "E-CKPT-FORMAT",
        "a checkpoint is written only by train(..., checkpoints: dir); this one was altered",
    )


def _check_pointer(root: Path, pointer: dict[str, Any]) -> tuple[str, str]:
    """The folder name and the manifest sha256 a valid pointer holds."""
    name, sha = pointer.get("checkpoint"), pointer.get("manifest_sha256")
    if set(pointer) != {"checkpoint", "manifest_sha256"}:
        raise _schema_error(root, POINTER, f"keys {sorted(pointer)}")
    if not isinstance(name, str) or _FOLDER.fullmatch(name) is None:
        raise _fail(
            root, f"{POINTER} names a checkpoint that does not exist: {name!r}", "E-CKPT-MISSING"
        )
    if not isinstance(sha, str) or _SHA256.fullmatch(sha) is None:
        raise _schema_error(root, POINTER, "`manifest_sha256` is not a sha256 in hex")
    return name, sha


def _check_manifest(root: Path, folder: Path, manifest: dict[str, Any]) -> None:
    """The manifest's schema (see `save`); a wrong format or version is `E-CKPT-FORMAT` too."""
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise _fail(
            root,
            f"unsupported format {manifest.get('format')!r} version {manifest.get('version')!r}",
            "E-CKPT-FORMAT",
        )
    where = f"{folder.name}/{MANIFEST}"
    if set(manifest) != {"format", "version", "updates", "identity", "files"}:
        raise _schema_error(root, where, f"keys {sorted(manifest)}")
    updates = manifest["updates"]
    if type(updates) is not int or not 0 <= updates <= MAX_UPDATES:
        raise _schema_error(root, where, f"`updates` is {updates!r}, not a count of updates")
    m = _FOLDER.fullmatch(folder.name)
    if m is not None and int(m.group(1)) != updates:
        raise _schema_error(root, where, f"`updates` is {updates}, the folder name says otherwise")
    identity = manifest["identity"]
    if not isinstance(identity, dict) or set(identity) != {
        "base_path",
        "base_fingerprint",
        "profile",
        "kernel_identity",
    }:
        raise _schema_error(root, where, "`identity` is not the identity of a training run")
    if not isinstance(identity["base_path"], str) or not isinstance(
        identity["base_fingerprint"], str
    ):
        raise _schema_error(root, where, "the base model's path or fingerprint is missing")
    if _SHA256.fullmatch(identity["base_fingerprint"]) is None:
        raise _schema_error(root, where, "the base model's fingerprint is not a sha256 in hex")
    entries = manifest["files"]
    if not isinstance(entries, dict) or set(entries) != {TENSORS, STATE}:
        raise _schema_error(root, where, f"`files` must list exactly {TENSORS} and {STATE}")
    for name, entry in entries.items():
        size = entry.get("bytes") if isinstance(entry, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        limit = TENSORS_LIMIT if name == TENSORS else JSON_LIMIT
        if (
            not isinstance(entry, dict)
            or set(entry) != {"bytes", "sha256"}
            or type(size) is not int
            or not 0 <= size <= limit
            or not isinstance(sha, str)
            or _SHA256.fullmatch(sha) is None
        ):
            raise _schema_error(root, where, f"the entry of {name} is not {{bytes, sha256}}")


def _verified_bytes(directory: Path, folder: Path, name: str, expected: dict[str, Any]) -> bytes:
    """The file `name` of `folder`, of exactly the size and sha256 the (validated) manifest
    states: no more than that size is ever read."""
    path = folder / name
    try:
        data = files.read_bytes(path, expected["bytes"])
    except AnerRuntimeError as e:
        if e.code == "E-FILE-MISSING":
            raise _fail(directory, f"{folder.name}/{name} is missing", "E-CKPT-MISSING") from None
        if e.code != "E-FILE-TOO-LARGE":
            raise _fail(directory, e.message, e.code) from None
        data = b""  # larger than the manifest says: reported just below
        size = path.stat().st_size
    else:
        size = len(data)
    if size != expected["bytes"]:
        raise _fail(
            directory,
            f"{folder.name}/{name} is truncated or extended: "
            f"{size} bytes, the manifest says {expected['bytes']}",
            "E-CKPT-TRUNCATED",
        )
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
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
    direct = _FOLDER.fullmatch(root.name)
    if (root / MANIFEST).is_file() and direct is not None:
        folder, want, source = root, direct.group(2), "the folder name"
    else:
        name, want = _check_pointer(root, _read_json(root, root / POINTER))
        folder, source = root / name, POINTER
        if not folder.is_dir():
            raise _fail(
                root,
                f"{POINTER} names a checkpoint that does not exist: {name!r}",
                "E-CKPT-MISSING",
            )
    try:
        data = files.read_bytes(folder / MANIFEST, JSON_LIMIT)
    except AnerRuntimeError as e:
        code = "E-CKPT-MISSING" if e.code == "E-FILE-MISSING" else e.code
        raise _fail(root, f"{folder.name}/{MANIFEST}: {e.message}", code) from None
    if hashlib.sha256(data).hexdigest()[: len(want)] != want:  # the whole digest, or the 12
        raise _fail(  # digits of a folder name (checked to be 12 hex digits)
            root,
            f"{folder.name}/{MANIFEST} is corrupted: its sha256 does not match {source}",
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
    _check_manifest(root, folder, manifest)
    entries = manifest["files"]
    tensor_bytes = _verified_bytes(root, folder, TENSORS, entries[TENSORS])
    meta = _read_json(root, folder / STATE, _verified_bytes(root, folder, STATE, entries[STATE]))
    tensors = _tensors(root, folder, tensor_bytes)
    identity = manifest["identity"]
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
        updates=manifest["updates"],
        tensors=tensors,
        meta=meta,
        identity=identity,
    )


def _tensors(root: Path, folder: Path, data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a verified tensors file: a well-formed safetensors file of finite numbers
    (training never saves a NaN or an infinity: it skips such an update)."""
    where = f"{folder.name}/{TENSORS}"
    try:
        tensors = st_load(data)
    except Exception as e:  # safetensors raises its own error types for a malformed file
        raise _schema_error(root, where, f"not a safetensors file ({e})") from None
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise _fail(
                root,
                f"{where}: tensor {name!r} holds NaN or infinite values",
                "E-CKPT-CORRUPT",
                "training never saves such a state; this checkpoint was altered",
            )
    return tensors


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
    else:
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
