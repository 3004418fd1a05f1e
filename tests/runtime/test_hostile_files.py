"""Hostile and careless files around the runtime: no user file lost, no forged checkpoint or
adapter accepted, no unbounded read, no template without bounds (docs/security.md)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters
from aner_lang.runtime.adapters.files import load_adapter, save_adapter
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.io import fingerprint
from aner_lang.runtime.tasks.data import from_jsonl
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.state import TrainState


class _State:
    def __init__(self, updates: int, base: Path) -> None:
        self.tensors = {"adapter/w": torch.full((2, 3), float(updates))}
        self.meta = {"counters": {"updates": updates}, "base": {"path": str(base)}}

    def to_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def to_json(self) -> dict:
        return self.meta


@pytest.fixture
def base(tmp_path: Path) -> Path:
    p = tmp_path / "base.gguf"
    p.write_bytes(os.urandom(1024))
    return p


def _code(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(AnerRuntimeError) as info:
        call()
    assert info.value.code != "E-INTERNAL", info.value
    return info.value.code


# ---- checkpoints ---------------------------------------------------------------------------------


def test_pruning_removes_only_folders_the_writer_made(tmp_path, base):
    root = tmp_path / "ckpt"
    root.mkdir()
    mine = [root / "update-notes", root / "update-000000-0123456789ab", root / ".update-x.tmp-1"]
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("the user's")
    for n in range(1, 4):
        last = checkpoint.save(root, _State(n, base), keep=0)
    written = sorted(p.name for p in root.iterdir() if p.name.startswith("update-0000"))
    assert written == sorted([last.name, "update-000000-0123456789ab"])
    assert all((folder / "keep.txt").read_text() == "the user's" for folder in mine)
    assert not [p for p in root.iterdir() if ".tmp-" in p.name and p not in mine]


def _forge(root: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Apply `edit` to the latest manifest (a dict) and recompute the pointer's digest."""
    pointer = json.loads((root / "latest.json").read_text())
    folder = root / pointer["checkpoint"]
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest, folder)
    data = json.dumps(manifest).encode()
    (folder / "manifest.json").write_bytes(data)
    pointer["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (root / "latest.json").write_text(json.dumps(pointer))


def _set_identity(key: str, value: object):  # type: ignore[no-untyped-def]
    return lambda m, folder: m["identity"].__setitem__(key, value)


def _nan_tensors(m: dict, folder: Path) -> None:
    from safetensors.torch import save

    data = save({"adapter/w": torch.tensor([float("nan")])})
    (folder / "tensors.safetensors").write_bytes(data)
    m["files"]["tensors.safetensors"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


@pytest.mark.parametrize(
    "edit, code",
    [
        (_set_identity("base_fingerprint", None), "E-CKPT-FORMAT"),
        (_set_identity("base_fingerprint", "0" * 64), "E-CKPT-BASE"),
        (lambda m, f: m.__setitem__("updates", 10**15), "E-CKPT-FORMAT"),
        (lambda m, f: m.__setitem__("updates", -1), "E-CKPT-FORMAT"),
        (lambda m, f: m.__setitem__("updates", 2.5), "E-CKPT-FORMAT"),
        (lambda m, f: m["files"].pop("state.json"), "E-CKPT-FORMAT"),
        (lambda m, f: m["files"]["state.json"].__setitem__("bytes", 10**30), "E-CKPT-FORMAT"),
        (lambda m, f: m.__setitem__("files", "x"), "E-CKPT-FORMAT"),
        (_nan_tensors, "E-CKPT-CORRUPT"),
    ],
)
def test_forged_checkpoints_with_recomputed_hashes_are_refused(tmp_path, base, edit, code):
    checkpoint.save(tmp_path, _State(1, base))
    _forge(tmp_path, edit)
    assert _code(lambda: checkpoint.load(tmp_path, base_path=base)) == code


def test_pointer_digest_is_compared_whole(tmp_path, base):
    checkpoint.save(tmp_path, _State(1, base))
    pointer = json.loads((tmp_path / "latest.json").read_text())
    for digest in ("", pointer["manifest_sha256"][:12], None):
        (tmp_path / "latest.json").write_text(json.dumps({**pointer, "manifest_sha256": digest}))
        assert _code(lambda: checkpoint.load(tmp_path)) in ("E-CKPT-FORMAT", "E-CKPT-CORRUPT")


def test_checkpoint_files_must_be_regular_and_of_the_stated_size(tmp_path, base):
    folder = checkpoint.save(tmp_path, _State(1, base))
    (folder / "state.json").unlink()
    (folder / "state.json").symlink_to("/dev/zero")
    assert _code(lambda: checkpoint.load(tmp_path)) == "E-FILE-KIND"
    (folder / "state.json").unlink()
    (folder / "state.json").write_bytes(b"{}" + b" " * 10_000_000)
    assert _code(lambda: checkpoint.load(tmp_path)) == "E-CKPT-TRUNCATED"


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"format": "aner.train-state/1"},
        {"format": "aner.train-state/1", "counters": [], "adapter": {}},
    ],
)
def test_malformed_training_state_is_a_format_error(meta):
    assert _code(lambda: TrainState.from_parts({}, meta)) == "E-STATE-FORMAT"


def test_fingerprint_cache_is_not_fooled_by_a_restored_mtime(tmp_path, base, monkeypatch):
    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path / "cache"))
    digest = fingerprint.fingerprint(base)
    st = base.stat()
    base.write_bytes(os.urandom(1024))  # same size
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    assert fingerprint.fingerprint(base) == fingerprint.sha256_file(base) != digest


# ---- adapters and exports ------------------------------------------------------------------------


def test_save_adapter_never_overwrites_unasked_nor_writes_into_the_base(tiny_model, tmp_path):
    adapter = adapters.lora(tiny_model, rank=2)
    out = tmp_path / "a"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _code(lambda: save_adapter(adapter, out)) == "E-FILE-EXISTS"
    save_adapter(adapter, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "adapter_config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    base = Path(tiny_model.path)
    assert _code(lambda: save_adapter(adapter, base, overwrite=True)) == "E-FILE-PROTECTED"


def test_export_never_overwrites_unasked_and_never_the_base(tiny_model, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"mine")
    assert _code(lambda: export_gguf(tiny_model, out)) == "E-FILE-EXISTS"
    assert out.read_bytes() == b"mine"
    base = Path(tiny_model.path)
    before = base.read_bytes()
    assert _code(lambda: export_gguf(tiny_model, base, overwrite=True)) == "E-FILE-PROTECTED"
    assert base.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize(
    "edit, code",
    [
        ({"r": 10_000_000}, "E-ADAPTER-RANK"),
        ({"r": "8"}, "E-ADAPTER-PEFT"),
        ({"lora_alpha": [1]}, "E-ADAPTER-PEFT"),
        ({"target_modules": 7}, "E-ADAPTER-PEFT"),
        ({"use_dora": "yes"}, "E-ADAPTER-PEFT"),
    ],
)
def test_malformed_peft_config_is_refused_before_allocating(tiny_model, tmp_path, edit, code):
    folder = save_adapter(adapters.lora(tiny_model, rank=2), tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **edit}))
    assert _code(lambda: load_adapter(tiny_model, folder)) == code


def test_malformed_aner_adapter_config_is_refused(tiny_model, tmp_path):
    folder = save_adapter(adapters.lora(tiny_model, rank=2), tmp_path / "a", "safetensors")
    meta = json.loads((folder / "adapter.json").read_text())
    meta["config"]["seed"] = 10**30  # found by the fuzz suite: torch's seed overflowed
    (folder / "adapter.json").write_text(json.dumps(meta))
    assert _code(lambda: load_adapter(tiny_model, folder)) == "E-ADAPTER-CONFIG"
    meta["config"]["seed"] = 1
    meta["config"]["rank"] = "eight"
    (folder / "adapter.json").write_text(json.dumps(meta))
    assert _code(lambda: load_adapter(tiny_model, folder)) == "E-ADAPTER-CONFIG"
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / "adapter.json").symlink_to("/dev/urandom")
    assert _code(lambda: load_adapter(tiny_model, folder)) == "E-FILE-KIND"


# ---- datasets and templates ----------------------------------------------------------------------


def test_jsonl_errors_name_the_file_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n{"text": 5}\n')
    with pytest.raises(AnerRuntimeError, match=r"d\.jsonl:3:") as info:
        from_jsonl(path, 16)
    assert info.value.code == "E-DATA-FIELD"
    path.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(AnerRuntimeError, match="line 2") as info:
        from_jsonl(path, 16)
    assert info.value.code == "E-FILE-ENCODING"


def test_jsonl_keeps_a_line_separator_inside_its_string(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a\u2028b"}\n', encoding="utf-8")
    assert [r.completion for r in from_jsonl(path, 16).records] == ["a\u2028b"]


def test_jsonl_line_length_is_bounded(tmp_path, monkeypatch):
    from aner_lang.host import files

    monkeypatch.setattr(files, "LINE_LIMIT", 1000)
    monkeypatch.setattr(files.lines, "__defaults__", (files.DATA_LIMIT, 1000))
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "' + "a" * 5000 + '"}\n')
    with pytest.raises(AnerRuntimeError, match="longer than 1,000 bytes") as info:
        from_jsonl(path, 16)
    assert info.value.code == "E-FILE-TOO-LARGE"


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ 'a' * 100000000 }}", "repeated"),
        ("{{ 10 ** 100000 }}", "exponent"),
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "too long"),
    ],
)
def test_chat_template_output_is_bounded(template, words):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from aner_lang.runtime.model.tokenizer import _bounded_environment, _render_bounded

    env = _bounded_environment(ImmutableSandboxedEnvironment)()
    with pytest.raises(AnerRuntimeError, match=words):
        _render_bounded(env.from_string(template), [])


def test_chat_template_time_is_bounded(monkeypatch):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from aner_lang.runtime.model import tokenizer

    monkeypatch.setattr(tokenizer, "TEMPLATE_SECONDS", 0.2)
    env = tokenizer._bounded_environment(ImmutableSandboxedEnvironment)()
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(AnerRuntimeError, match=r"took more than 0\.2 s"):
        tokenizer._render_bounded(env.from_string(loop), [])


# ---- model files ---------------------------------------------------------------------------------


def test_a_huge_layer_count_is_refused_before_the_layers_are_listed(tmp_path):
    """Found by the fuzz suite: block_count 2**31 - 1 made the loader list billions of weights."""
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.testing.fixture import write_fixture

    path = write_fixture(tmp_path / "t.gguf", "tiny")
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len(b"llama.block_count") + 4  # key, value type
    data[at : at + 4] = (2**31 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(AnerRuntimeError, match=r"blk\.2147483646") as info:
        load_model(path)
    assert info.value.code == "E-GGUF-TENSOR"


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"tokenizer.ggml.tokens": "abc"}, "not a list of strings"),
        ({"tokenizer.ggml.tokens": ["a", "b" * 5000]}, "5,000 characters"),
        ({"tokenizer.ggml.scores": [float("nan"), 0.0]}, "finite numbers"),
        ({"tokenizer.ggml.merges": [1]}, "merges"),
        ({"tokenizer.ggml.unknown_token_id": -1}, "not a token id"),
    ],
)
def test_tokenizer_metadata_is_checked_before_use(edit, words):
    from aner_lang.runtime.model.tokenizer import _build_backend

    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], **edit}
    with pytest.raises(AnerRuntimeError, match=words) as info:
        _build_backend(meta, "m.gguf")
    assert info.value.code == "E-TOKENIZER"
