"""Training data without a scored token is refused before the run, under the real SmolLM2's
tokenizer (`aner_lang.runtime.train.data_precheck`), and only where the script certainly meets it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.check.before_run import check_before_run
from aner_lang.runtime.train.data_precheck import scoreless_data

PROMPTS = [
    "What is the capital of France? Answer in one word, please.",
    "What is the capital of Italy? Answer in one word, please.",
    "Name the largest planet of the solar system, in one word.",
]
"""Prompts of well over 8 tokens each under SmolLM2's tokenizer."""


@pytest.fixture
def folder(tmp_path: Path, smollm2_path: Path) -> Path:
    rows = [{"prompt": p, "completion": "Paris"} for p in PROMPTS]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "model.gguf").symlink_to(smollm2_path)
    return tmp_path


def _source(context: int, train: str = "train(lora(m, rank: 2), d, steps: 1)") -> str:
    return (
        'let m = load_model("model.gguf")\n'
        'let d = load_jsonl("qa.jsonl", prompt_field: "prompt", completion_field: "completion", '
        f"context: {context})\n"
        'print("before")\n'
        f"let _a = {train}\n"
    )


def _errors(folder: Path, source: str) -> list[tuple[int, int, str]]:
    (folder / "s.aner").write_text(source)
    analysis = check_before_run(source, str(folder / "s.aner"), running=True)
    assert not analysis.errors, analysis.errors
    return [(d.span.line, d.span.col, d.message) for d in scoreless_data(analysis)]


def test_a_context_the_prompts_fill_is_refused_before_anything_runs(folder):
    """`aner run`: one located error, nothing of the script run (its print), exit 1."""
    (folder / "s.aner").write_text(_source(8))
    proc = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", "s.aner"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error[" in line]
    assert errors == [
        "s.aner:4:34: error[E-TRAIN-DATA]: train: the training set has no scored tokens"
    ], proc.stderr
    assert "none of the 3 examples" in proc.stderr and "context of 8 tokens" in proc.stderr


def test_a_context_that_leaves_a_response_token_is_not_refused(folder):
    assert _errors(folder, _source(64)) == []


@pytest.mark.parametrize(
    "train, column",
    [
        ("train(lora(m, rank: 2), take(shuffle(d, seed: 2), 2), steps: 1)", 34),
        ("train(lora(m, rank: 2), pack(split(d, fraction: 0.4).train), steps: 1)", 34),
        ("train(lora(m, rank: 2), split(d, fraction: 0.4).held_out, steps: 1)", 34),
    ],
)
def test_selections_of_a_scoreless_source_are_refused(folder, train, column):
    """Taking, shuffling, packing and splitting never add a scored token."""
    assert _errors(folder, _source(8, train)) == [
        (4, column, "train: the training set has no scored tokens")
    ]


def test_a_scoreless_validation_set_is_refused_at_its_argument(folder):
    source = _source(64, "train(lora(m, rank: 2), d, steps: 1, validation: v)").replace(
        'print("before")',
        'let v = load_jsonl("qa.jsonl", prompt_field: "prompt", completion_field: '
        '"completion", context: 8)',
    )
    errors = _errors(folder, source)
    assert [(line, message) for line, _, message in errors] == [
        (4, "train: the validation set has no scored tokens")
    ]


@pytest.mark.parametrize(
    "change",
    [
        # the call may not run: in a branch, in a function never called
        lambda s: s.replace("let _a = ", "if len(PROMPTS) > 5 {\n  let _a = ") + "}\n",
        lambda s: s.replace("let _a = ", "fn later() {\n  let _a = ") + "}\n",
        # the data file may be written by the script before it is read
        lambda s: 'write_json("qa.jsonl", 1, overwrite: true)\n' + s,
        # the dataset or the model depends on the run
        lambda s: s.replace("context: 8", 'context: len(read_text("name.txt")) - 2'),
        lambda s: s.replace('load_model("model.gguf")', 'load_model(read_text("name.txt"))'),
    ],
)
def test_what_the_run_decides_is_left_to_the_call(folder, change):
    """A check before a run never refuses a script that might run: only a call that certainly
    runs, with a model and data known before the run, is checked."""
    (folder / "name.txt").write_text("model.gguf")
    source = change(_source(8)).replace("PROMPTS", '"ab"')
    assert _errors(folder, source) == []


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """A folder with chat data and a model whose file has no chat template (a base model)."""
    from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

    meta = {k: v for k, v in embedded_tokenizer().items() if k != "tokenizer.chat_template"}
    write_fixture(tmp_path / "model.gguf", "tiny", seed=0, tokenizer=meta)
    chats = [
        {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "Paris"}]}
        for p in PROMPTS
    ]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    (tmp_path / "chatml.jinja").write_text(CHATML)
    return tmp_path


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER_TURNS_ONLY = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
)
"""A template that leaves the assistant's turns out: chat data has nothing to score under it."""


def _chat_source(template: str) -> str:
    return (
        f'let m = load_model("model.gguf", chat_template: {template})\n'
        'let d = load_data("chats.jsonl", format: chat, context: 256)\n'
        'print("before")\n'
        "let _a = train(lora(m, rank: 2), d, steps: 1)\n"
    )


@pytest.mark.parametrize("template", [json.dumps(CHATML), 'read_text("chatml.jinja")'])
def test_chat_data_under_the_scripts_own_template_is_not_refused(bare, template):
    """The file has no template; the one the script gives `load_model` is applied (a literal)
    or the call left to the run (a template read at run time)."""
    assert _errors(bare, _chat_source(template)) == []


def test_the_scripts_own_template_is_the_one_chat_data_is_checked_under(bare):
    assert _errors(bare, _chat_source(json.dumps(USER_TURNS_ONLY))) == [
        (4, 34, "train: the training set has no scored tokens")
    ]
