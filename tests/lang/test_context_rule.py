"""A data `context:` of 1 leaves no token to score, which is certain without a tokenizer: every
data builtin with a `context` declares `data.CONTEXT_RULE`, so `aner check` refuses a literal
`context: 1` where it is written (no model is loaded to find out), and a computed one is refused
at the dataset's call, not after a model loaded for `train`."""

from __future__ import annotations

from aner_lang.builtins import registry
from aner_lang.builtins.data import CONTEXT_RULE
from aner_lang.check import analyze
from aner_lang.cli import main


def _with_context() -> list[str]:
    return sorted(
        name
        for name, overloads in registry().functions.items()
        if any(p.name == "context" for b in overloads for p in b.params)
    )


def test_every_data_builtin_with_a_context_refuses_one_token_at_check_time():
    names = _with_context()
    assert {"texts", "load_jsonl", "load_data", "load_pairs"} <= set(names)
    for name in names:
        for b in registry().functions[name]:
            assert CONTEXT_RULE in b.constraints, name
        first = '["some text"]' if name == "texts" else '"data.jsonl"'
        source = (
            f'let base = load_model("model.gguf")\nlet d = {name}({first}, context: 1)\nprint(d)\n'
        )
        errors = [d for d in analyze(source).diagnostics if d.code == "E-CONSTRAINT"]
        assert errors and errors[0].span is not None and errors[0].span.line == 2, name


def test_a_computed_context_of_one_is_refused_at_the_dataset_call(tmp_path, capsys):
    script = tmp_path / "c.aner"
    script.write_text(
        'let c = len("x")\nprint("before")\nlet d = texts(["some text"], context: c)\n'
        'print("after")\n'
    )
    assert main(["run", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "before" in out and "after" not in out
    assert "c.aner:3:" in err and "E-CONSTRAINT" in err and "at least 2 tokens" in err
