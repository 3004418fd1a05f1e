"""The model builtins as scripts use them: declarations agree with implementations, scripts run."""

from __future__ import annotations

import importlib
import inspect
import io
import json
from pathlib import Path

import pytest

from aner_lang.builtins import model as model_decls

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "generate.aner"


@pytest.mark.parametrize("b", model_decls.DECLARATIONS.builtins, ids=lambda b: b.name)
def test_declaration_matches_implementation(b):
    module, _, name = b.impl.partition(":")
    fn = getattr(importlib.import_module(module), name)
    params = list(inspect.signature(fn).parameters)
    if b.needs_context:
        params = params[1:]
    assert params[: len(b.params)] == [p.name for p in b.params]
    assert all(
        p.default is not inspect.Parameter.empty
        for p in list(inspect.signature(fn).parameters.values())[len(b.params) + b.needs_context :]
    )


def test_overloads_for_another_receiver():
    names = {b.name: b for b in model_decls.overloads_for("Adapter")}
    assert set(names) >= {"generate", "chat", "evaluate"}
    assert names["generate"].params[0].type == "Adapter"
    assert (
        names["generate"].params[1:]
        == next(b for b in model_decls.DECLARATIONS.builtins if b.name == "generate").params[1:]
    )


def _run(source: str, script_dir: Path) -> str:
    from aner_lang.check import analyze
    from aner_lang.interp import ExecContext, run

    path = script_dir / "script.aner"
    analysis = analyze(source, str(path))
    errors = [d for d in analysis.diagnostics if d.severity == "error"]
    assert not errors, errors
    out = io.StringIO()
    run(analysis, ExecContext(script_dir=script_dir, stdout=out, script_path=path))
    return out.getvalue()


def test_script_on_tiny_fixture(tiny_gguf, tmp_path):
    (tmp_path / "qa.jsonl").write_text(json.dumps({"q": "Hi?", "a": " Hello."}) + "\n")
    out = _run(
        f'''
let m = load_model("{tiny_gguf}", storage: float16, device: cpu)
let info = model_info(m)
print("${{info.layers}} ${{info.hidden_size}} ${{info.kv_heads}} ${{info.storage}}")
let ids = tokenize(m, "Hello world")
print(detokenize(m, ids))
print(len(generate(m, "Once upon", max_tokens: 3, temperature: 0.7, seed: 1)) > 0)
let qa = load_jsonl("qa.jsonl", prompt_field: "q", completion_field: "a", context: 16)
print(evaluate(m, qa).scored_tokens)
''',
        tmp_path,
    )
    lines = out.splitlines()
    assert lines[0] == "2 64 2 float16"
    assert lines[1] == "Hello world"
    assert lines[2] == "true"
    assert int(lines[3]) == 3  # " Hello." is 2 tokens, plus EOS


def test_bad_model_path_is_a_diagnostic_not_a_traceback(tmp_path):
    from aner_lang.interp import AnerError

    with pytest.raises(AnerError) as info:
        _run('let m = load_model("missing.gguf")', tmp_path)
    assert "missing.gguf: no such model file" in str(info.value)


def test_generate_example_runs_on_the_real_model(real_model, smollm2_path, monkeypatch):
    """The README's main job, end to end through checker and interpreter; the model load itself
    is the session's `real_model` (load_model on this file is tested by every real-model test)."""
    from aner_lang.runtime.load import loader as runtime_model

    def shared_load(path, storage, device, quantize_embeddings=False, chat_template=None):
        assert Path(path) == smollm2_path and storage == "float32" and not quantize_embeddings
        assert chat_template is None
        return real_model

    monkeypatch.setattr(runtime_model, "load_model", shared_load)
    out = _run(EXAMPLE.read_text(), EXAMPLE.parent)
    assert "134515008 parameters, 30 layers" in out
    assert "greedy: The capital of France is Paris." in out
    assert "chat: " in out and "perplexity" in out
