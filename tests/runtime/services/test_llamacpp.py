"""connect(...) against llama.cpp's real server (xllamacpp) on localhost: generate, chat and
evaluate agree with Aner running the same GGUF locally; the served model can be a merged export
of a trained adapter; a script that only uses services runs where torch is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aner_lang.runtime.adapters import lora
from aner_lang.runtime.adapters.merge import merge
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.services import scoring, service
from aner_lang.runtime.tasks.data import Dataset, TokenRecord, from_jsonl, from_texts
from aner_lang.runtime.tasks.evaluate import evaluate
from aner_lang.runtime.tasks.generate import Sampling, chat_text, generate_text
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train

pytest.importorskip("xllamacpp")

PROMPTS = ["The capital of France is", "Once upon a time, a small robot"]
HELD_OUT = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Seven engineers share one worktree and commit their own files.",
]


@pytest.fixture(scope="module")
def base_f16(real_model, tmp_path_factory) -> Path:
    return export_gguf(real_model, tmp_path_factory.mktemp("served") / "base-f16.gguf", "f16")


@pytest.fixture(scope="module")
def served(base_f16):
    from aner_lang.testing.llamacpp import llama_server

    with llama_server(base_f16) as url:
        yield url


@pytest.fixture(scope="module")
def local(base_f16):
    """The same file, run by Aner."""
    return load_model(base_f16, "float32", "cpu")


def test_generate_and_chat_match_aner_on_the_same_file(served, local) -> None:
    llm = service.connect(served)
    assert llm.model and llm.url == served
    for prompt in PROMPTS:
        assert service.generate(llm, prompt, max_tokens=16) == generate_text(
            local, prompt, Sampling(max_tokens=16)
        )
    message = "What is the capital of France?"
    assert service.chat(llm, message, max_tokens=16) == chat_text(
        local, message, None, Sampling(max_tokens=16)
    )


def test_evaluate_matches_aner_on_the_same_file(served, local) -> None:
    data = from_texts(HELD_OUT, 32)
    remote = scoring.evaluate(service.connect(served), data)
    here = evaluate(local, data)
    assert remote.scored_tokens == here.scored_tokens > 10
    assert remote.loss == pytest.approx(here.loss, abs=2e-3)


class _Counted:
    """A service's requests, counted by path."""

    def __init__(self, llm: service.Service, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: Counter[str] = Counter()
        post = llm.client.post

        def counted(path: str, body: dict) -> object:
            self.paths[path] += 1
            return post(path, body)

        monkeypatch.setattr(llm.client, "post", counted)


def _scoring_datasets(tok: scoring.ServiceTokenizer, tmp_path: Path) -> dict[str, tuple]:
    """(dataset, the same examples one a row, /completion requests one text a request takes)."""
    a = tok.encode(HELD_OUT[0], add_special=False)
    b = tok.encode(HELD_OUT[1], add_special=False)
    eos = tok.eos_id
    # two texts in one row: the first three targets and the second text's first two unscored
    ids = (*a, eos, *b, eos)
    scored = tuple(i >= 3 and not len(a) + 1 <= i < len(a) + 3 for i in range(len(ids)))
    two_in_a_row = Dataset((TokenRecord(ids, scored),), 64, "tokens")
    jsonl = tmp_path / "pc.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps({"p": p, "c": c}) + "\n"
            for p, c in [("The capital of France is", " Paris."), ("Seven engineers", " commit.")]
        )
    )
    texts = from_texts(HELD_OUT, 32)
    packed = from_texts([*HELD_OUT, "A short one."], 64).derive(packed=True)
    return {
        "texts": (texts, texts, 2),
        "prompt and completion": (from_jsonl(jsonl, 32, "", "p", "c"),) * 2 + (2,),
        "two texts in one row": (two_in_a_row, two_in_a_row, 2),
        "packed": (packed, packed.derive(packed=False), 3),
    }


def _per_token(llm: service.Service, data: Dataset) -> tuple[float, int]:
    """Summed loss and count, one forced token a request (each example a row of its own)."""
    total, count = 0.0, 0
    for example in data.examples(llm.tokenizer):
        ids = list(example.ids)
        for t in range(1, len(ids)):
            if example.scored[t]:
                total -= scoring.forced_logprob(llm, ids[:t], ids[t])
                count += 1
    return total, count


def test_evaluate_scores_a_text_in_one_request_as_token_by_token(
    served, tmp_path, monkeypatch
) -> None:
    llm = service.connect(served)
    llm.tokenizer = tok = scoring.ServiceTokenizer(llm)
    for name, (data, unpacked, requests) in _scoring_datasets(tok, tmp_path).items():
        counted = _Counted(llm, monkeypatch)
        remote = scoring.evaluate(llm, data)
        assert counted.paths["/completion"] == requests, name
        total, count = _per_token(llm, unpacked)
        assert counted.paths["/completion"] == requests + count, name
        assert remote.scored_tokens == count > 3, name
        # the same model steps; only how llama.cpp splits a prompt into batches (which depends
        # on what its prompt cache holds from the request before) moves the last digits
        assert remote.loss == pytest.approx(total / count, rel=2e-3), name


class _NoGrammarProxy:
    """llama.cpp's server behind a proxy that refuses token-id grammars the way a llama.cpp
    from before them does (HTTP 400, "failed to parse grammar"), and passes the rest on."""

    def __init__(self, upstream: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if body and "grammar" in json.loads(body):
                    status, payload = 400, b'{"error": {"code": 400, "message": "Failed to '
                    payload += b'initialize samplers: failed to parse grammar"}}'
                else:
                    request = urllib.request.Request(
                        upstream + self.path,
                        data=body,
                        method=self.command,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(request, timeout=120) as answer:
                        status, payload = answer.status, answer.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_server_without_token_grammars_is_scored_token_by_token(served, monkeypatch) -> None:
    proxy = _NoGrammarProxy(served)
    try:
        data = from_texts(HELD_OUT, 32)
        want = scoring.evaluate(service.connect(served), data)
        llm = service.connect(proxy.url)
        counted = _Counted(llm, monkeypatch)
        got = scoring.evaluate(llm, data)
    finally:
        proxy.httpd.shutdown()
    # each text: one refused request, then one a scored token
    assert counted.paths["/completion"] == len(HELD_OUT) + got.scored_tokens
    assert (got.scored_tokens, got.loss) == (want.scored_tokens, pytest.approx(want.loss, 1e-5))


def test_the_real_smollm2_gguf_served_as_is(real_model, smollm2_path) -> None:
    from aner_lang.testing.llamacpp import llama_server

    data = from_texts(HELD_OUT, 32)
    with llama_server(smollm2_path) as url:
        llm = service.connect(url)
        text = service.generate(llm, PROMPTS[0], max_tokens=8)
        assert text and text == service.generate(llm, PROMPTS[0], max_tokens=8)
        remote = scoring.evaluate(llm, data)
    # llama.cpp multiplies Q4_1 weights by 8-bit quantized activations, Aner by fp32 ones
    # (the same file as f16 agrees to 2e-3 above): 0.085 nats apart on these texts
    assert remote.loss == pytest.approx(evaluate(real_model, data).loss, rel=0.02)


@pytest.mark.slow
def test_a_merged_export_of_a_trained_adapter_is_served(real_model, tmp_path) -> None:
    from aner_lang.testing.llamacpp import llama_server

    adapter = lora(real_model, rank=4, alpha=8.0, targets=["q_proj", "v_proj"], seed=3)
    train(adapter, from_texts(HELD_OUT, 32), profile(), steps=3, learning_rate=5e-3, micro_batch=2)
    merged = merge(adapter)
    with llama_server(export_gguf(merged, tmp_path / "merged-f16.gguf", "f16")) as url:
        llm = service.connect(url)
        for prompt in ["The quiet mountain", "Seven engineers"]:
            want = generate_text(merged, prompt, Sampling(max_tokens=12))
            assert want != generate_text(real_model, prompt, Sampling(max_tokens=12))
            assert service.generate(llm, prompt, max_tokens=12) == want


_NO_NATIVE = """
import sys, importlib.abc
BLOCKED = {"torch", "numpy", "gguf", "tokenizers", "safetensors", "jinja2", "xllamacpp"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Block())
from aner_lang.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _without_native(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _NO_NATIVE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def test_a_services_only_script_runs_without_the_native_runtime(served, base_f16, tmp_path) -> None:
    script = tmp_path / "remote.aner"
    script.write_text(
        f'let llm = connect("{served}", timeout: 120.0)\n'
        'print(generate(llm, "The capital of France is", max_tokens: 4))\n'
        'let e = evaluate(llm, texts(["The quiet mountain lake."], context: 16))\n'
        'print("loss ${e.loss} over ${e.scored_tokens}")\n'
    )
    result = _without_native("run", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    *generated, last = result.stdout.splitlines()
    assert "Paris" in generated[0] and last.startswith("loss ") and last.endswith(" over 5")

    native = tmp_path / "native.aner"
    (tmp_path / "model.gguf").symlink_to(base_f16)  # `aner check` looks at the file it names
    native.write_text(
        'print("before")\nlet m = load_model("model.gguf")\nprint(generate(m, "Hi"))\n'
    )
    refused = _without_native("run", str(native), cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert (
        "native.aner:2:9: error[E-NATIVE-UNAVAILABLE]: native runtime not installed: "
        "`load_model` needs the Python package 'torch'" in refused.stderr
    )
    assert "1 more call(s) in this script need it too" in refused.stderr
    checked = _without_native("check", str(native), cwd=tmp_path)
    assert checked.returncode == 0 and "warning[W-NATIVE-UNAVAILABLE]" in checked.stderr
