"""Checkpoint files: round trip, atomicity under a real SIGKILL, and refusal of bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io import fingerprint
from aner_lang.runtime.train import checkpoint


class _State:
    """A minimal object following the trainer state contract (to_tensors / to_json)."""

    def __init__(self, updates: int, base: Path, profile: dict | None = None) -> None:
        g = torch.Generator().manual_seed(updates)
        self.tensors = {
            "adapter/layers.0.self_attn.q_proj.lora_A": torch.randn(2, 64, generator=g),
            "optim/exp_avg_sq/layers.0.self_attn.q_proj.lora_A": torch.rand(2, 64, generator=g),
            "optim/step/layers.0.self_attn.q_proj.lora_A": torch.tensor(float(updates)),
            "rng/cpu": torch.Generator().manual_seed(updates).get_state(),
            "half": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        }
        self.meta = {
            "counters": {"updates": updates, "scored_tokens": 17 * updates},
            "profile": profile or {"precision": "float32", "optimizer": "adamw"},
            "kernel_identity": "host_tiled",
            "base": {"path": str(base)},
            "loss_scale": {"scale": 65536.0, "growth_tracker": 1},
        }

    def to_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def to_json(self) -> dict:
        return self.meta


@pytest.fixture
def base(tmp_path) -> Path:
    p = tmp_path / "base.gguf"
    p.write_bytes(os.urandom(4096))
    return p


def _latest_folder(d: Path) -> Path:
    return d / json.loads((d / "latest.json").read_text())["checkpoint"]


def test_round_trip_is_exact_and_never_holds_the_base(tmp_path, base):
    s = _State(3, base)
    folder = checkpoint.save(tmp_path / "ck", s)
    ck = checkpoint.load(
        tmp_path / "ck", base_path=base, profile=s.meta["profile"], kernel_identity="host_tiled"
    )
    assert ck.updates == 3 and ck.meta == s.meta and ck.folder == folder
    assert set(ck.tensors) == set(s.tensors)
    for k, v in s.tensors.items():
        assert ck.tensors[k].dtype == v.dtype and torch.equal(ck.tensors[k], v)
    assert ck.identity["base_fingerprint"] == fingerprint.sha256_file(base)
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "state.json",
        "tensors.safetensors",
    ]
    assert sum(p.stat().st_size for p in folder.iterdir()) < 8192  # no 4 KiB base inside


def test_new_checkpoint_replaces_the_old_one(tmp_path, base):
    d = tmp_path / "ck"
    checkpoint.save(d, _State(1, base))
    checkpoint.save(d, _State(2, base))
    checkpoint.save(d, _State(3, base))
    assert checkpoint.load(d).updates == 3
    assert len([p for p in d.iterdir() if p.name.startswith("update-")]) == 2  # current + 1 kept


def test_crash_before_publishing_keeps_the_previous_checkpoint(tmp_path, base, monkeypatch):
    d = tmp_path / "ck"
    checkpoint.save(d, _State(1, base))
    real_replace = os.replace

    def crash_on_pointer(src, dst):
        if Path(dst).name == "latest.json":
            raise OSError("simulated power loss")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", crash_on_pointer)
    with pytest.raises(OSError):
        checkpoint.save(d, _State(2, base))
    monkeypatch.undo()
    assert checkpoint.load(d).updates == 1


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (lambda data: data[:-8], "E-CKPT-TRUNCATED"),
        (lambda data: _flip(data, 700), "E-CKPT-CORRUPT"),
    ],
)
def test_a_tensors_file_that_does_not_read_back_as_written_is_never_published(
    tmp_path, base, monkeypatch, damage, code
):
    """`save` reads its tensors file back, a piece at a time, and compares it with the memory it
    came from: a short or altered file is an error before anything is published, the previous
    checkpoint stays the latest, and a good one is written whole across many pieces."""
    d = tmp_path / "ck"
    monkeypatch.setattr(checkpoint, "_PIECE", 256)  # every tensor spans several pieces
    checkpoint.save(d, _State(1, base))
    write = checkpoint.TensorFile.write

    def damaged(self, out):  # type: ignore[no-untyped-def]
        out.write(damage(b"".join(bytes(c) for c in self.chunks())))

    monkeypatch.setattr(checkpoint.TensorFile, "write", damaged)
    with pytest.raises(AnerRuntimeError) as e:
        checkpoint.save(d, _State(2, base))
    assert e.value.code == code and "tensors.safetensors" in e.value.message
    assert checkpoint.load(d).updates == 1
    monkeypatch.setattr(checkpoint.TensorFile, "write", write)
    checkpoint.save(d, _State(3, base))
    assert checkpoint.load(d).updates == 3
    assert not [p for p in d.iterdir() if ".tmp-" in p.name]  # the failed write's folder pruned


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


_WRITER = textwrap.dedent("""
    import sys, torch
    from aner_lang.runtime.train import checkpoint
    class S:
        def __init__(self, n): self.n = n
        def to_tensors(self): return {"w": torch.full((256, 1024), float(self.n))}
        def to_json(self): return {"counters": {"updates": self.n}, "profile": {}}
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        checkpoint.save(sys.argv[1], S(n))
""")


def test_sigkill_at_any_moment_leaves_a_loadable_checkpoint(tmp_path):
    d = tmp_path / "ck"
    for delay in (0.15, 0.4, 0.9):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(d)],
            stdout=subprocess.PIPE,
            env={**os.environ, "ANER_CACHE_DIR": str(tmp_path / "c")},
        )
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (d / "latest.json").exists():
            continue
        ck = checkpoint.load(d)
        assert torch.equal(ck.tensors["w"], torch.full((256, 1024), float(ck.updates)))


def test_truncated_file_is_refused(tmp_path, base):
    d = tmp_path / "ck"
    f = checkpoint.save(d, _State(1, base)) / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(AnerRuntimeError, match=r"tensors\.safetensors is truncated") as e:
        checkpoint.load(d)
    assert e.value.code == "E-CKPT-TRUNCATED"


@pytest.mark.parametrize("name", ["tensors.safetensors", "state.json", "manifest.json"])
def test_flipped_byte_is_refused(tmp_path, base, name):
    d = tmp_path / "ck"
    f = checkpoint.save(d, _State(1, base)) / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(AnerRuntimeError, match=f"{name} is corrupted") as e:
        checkpoint.load(d)
    assert e.value.code == "E-CKPT-CORRUPT"


def test_wrong_base_profile_or_kernel_is_refused(tmp_path, base):
    d = tmp_path / "ck"
    s = _State(1, base)
    checkpoint.save(d, s)
    other = tmp_path / "other.gguf"
    other.write_bytes(os.urandom(4096))
    with pytest.raises(AnerRuntimeError, match="the base model") as e:
        checkpoint.load(d, base_path=other)
    assert e.value.code == "E-CKPT-BASE"
    changed = {**s.meta["profile"], "precision": "bfloat16"}
    with pytest.raises(AnerRuntimeError, match="the training profile") as e:
        checkpoint.load(d, profile=changed)
    assert any("bfloat16" in n for n in e.value.notes)
    with pytest.raises(AnerRuntimeError, match="the kernel identity"):
        checkpoint.load(d, kernel_identity="fused:abc")


def test_missing_or_garbage_directory_gives_clear_errors(tmp_path):
    with pytest.raises(AnerRuntimeError, match="no such directory"):
        checkpoint.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnerRuntimeError, match=r"latest\.json is missing"):
        checkpoint.load(tmp_path / "empty")
    (tmp_path / "empty" / "latest.json").write_text("{not json")
    with pytest.raises(AnerRuntimeError, match="not valid JSON"):
        checkpoint.load(tmp_path / "empty")


def test_fingerprint_is_cached_by_size_and_mtime(tmp_path, base, monkeypatch):
    digest = fingerprint.fingerprint(base)
    assert digest == fingerprint.sha256_file(base)
    calls = []
    monkeypatch.setattr(fingerprint, "sha256_file", lambda p: calls.append(p) or "x")
    assert fingerprint.fingerprint(base) == digest and calls == []
    base.write_bytes(os.urandom(4096))  # same size, new mtime: must be rehashed
    os.utime(base, ns=(1, 1))
    assert fingerprint.fingerprint(base) == "x" and len(calls) == 1
    with pytest.raises(AnerRuntimeError, match="cannot fingerprint"):
        fingerprint.fingerprint(tmp_path / "absent.gguf")
