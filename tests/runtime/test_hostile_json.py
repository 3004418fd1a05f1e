"""Hostile JSON at every place Aner reads JSON: a value nested thousands of levels deep and an
integer of 5,000 digits are each a clear error naming the file and line (or skipped, where a
reader skips bad lines), never a RecursionError or ValueError traceback."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aner_lang.problems.errors import AnerRuntimeError

PAYLOADS = {
    "deep": ("[" * 5000 + "]" * 5000, "nested more than 100 levels"),
    "long integer": ("7" * 5000, "5,000 digits"),
}


def _document(payload: str) -> str:
    """A JSON object with the hostile value on its second line."""
    return '{"model_type": "llama",\n "hostile": ' + payload + "}"


def _jsonl(path: Path, payload: str) -> Path:
    fine = '{"text": "t", "prompt": "p", "chosen": "c", "rejected": "r"'
    path.write_text(fine + "}\n" + fine + ', "hostile": ' + payload + "}\n")
    return path


def _records(tmp: Path, payload: str) -> object:
    from aner_lang.datafiles.records import rows

    return list(rows(_jsonl(tmp / "d.ndjson", payload)))


def _text_data(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.tasks.data import from_jsonl

    return from_jsonl(_jsonl(tmp / "d.jsonl", payload), 16)


def _preference_data(tmp: Path, payload: str) -> object:
    from aner_lang.datafiles.preference_records import PairFormat
    from aner_lang.datafiles.records import records

    return records(_jsonl(tmp / "d.jsonl", payload), PairFormat())


def _hf_config(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.load.loader import load_model

    (tmp / "config.json").write_text(_document(payload))
    return load_model(tmp)


def _planned_config(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.train.plan import model_config

    (tmp / "m").mkdir()
    (tmp / "m" / "config.json").write_text(_document(payload))
    return model_config("m", tmp)


def _safetensors_index(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.io.source import SafetensorsSource

    (tmp / "config.json").write_text("{}")
    (tmp / "model.safetensors.index.json").write_text(_document(payload))
    return SafetensorsSource(tmp)


def _tokenizer_json(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.model.tokenizer import Tokenizer

    (tmp / "tokenizer.json").write_text(_document(payload))
    return Tokenizer.from_hf_folder(tmp)


def _tokenizer_config(tmp: Path, payload: str) -> object:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from aner_lang.runtime.model.tokenizer import Tokenizer

    HFTokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(
        str(tmp / "tokenizer.json")
    )
    (tmp / "tokenizer_config.json").write_text(_document(payload))
    return Tokenizer.from_hf_folder(tmp)


def _adapter_file(name: str, fmt: str) -> Callable[[Path, str], object]:
    def load(tmp: Path, payload: str, model: object) -> object:
        from aner_lang.runtime import adapters
        from aner_lang.runtime.adapters.files import load_adapter, save_adapter

        folder = save_adapter(adapters.lora(model, rank=2), tmp / "a", fmt)
        (folder / name).write_text(_document(payload))
        return load_adapter(model, folder)

    return load  # type: ignore[return-value]


def _checkpoint_pointer(tmp: Path, payload: str) -> object:
    from aner_lang.runtime.train import checkpoint

    (tmp / "latest.json").write_text(_document(payload))
    return checkpoint.load(tmp)


READERS: dict[str, tuple[Callable[..., object], str, str]] = {
    # name: (reader, error code, where the message places the value)
    "jsonl rows": (_records, "E-DATA-JSON", "d.ndjson:2:"),
    "text data": (_text_data, "E-DATA-JSON", "d.jsonl:2:"),
    "preference data": (_preference_data, "E-DATA-JSON", "d.jsonl:2:"),
    "config.json": (_hf_config, "E-HF-CONFIG", "line 2"),
    "config.json planned": (_planned_config, "E-HF-CONFIG", "line 2"),
    "safetensors index": (_safetensors_index, "E-HF-WEIGHTS", "line 2"),
    "tokenizer.json": (_tokenizer_json, "E-TOKENIZER", "line 2"),
    "tokenizer_config.json": (_tokenizer_config, "E-TOKENIZER", "line 2"),
    "checkpoint pointer": (_checkpoint_pointer, "E-CKPT-CORRUPT", "line 2"),
}


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("reader", READERS)
def test_a_hostile_value_is_an_error_at_its_file_and_line(tmp_path, reader, payload):
    read, code, where = READERS[reader]
    text, words = PAYLOADS[payload]
    with pytest.raises(AnerRuntimeError) as info:
        read(tmp_path, text)
    assert info.value.code == code, info.value
    assert words in info.value.message and where in info.value.message, info.value.message


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize(
    "name, fmt", [("adapter_config.json", "peft"), ("adapter.json", "safetensors")]
)
def test_a_hostile_adapter_config_is_an_error_at_its_line(tiny_model, tmp_path, name, fmt, payload):
    text, words = PAYLOADS[payload]
    with pytest.raises(AnerRuntimeError) as info:
        _adapter_file(name, fmt)(tmp_path, text, tiny_model)  # type: ignore[call-arg]
    assert info.value.code == "E-ADAPTER-FILE"
    assert name in info.value.message and words in info.value.message
    assert "line 2" in info.value.message


@pytest.mark.parametrize("payload", PAYLOADS)
def test_job_events_skip_a_hostile_line_and_keep_the_others(tmp_path, payload):
    from aner_lang.runtime.jobs.events import EVENTS, read

    text, _ = PAYLOADS[payload]
    (tmp_path / EVENTS).write_text(
        '{"event": "start"}\n{"event": "x", "v": ' + text + '}\n{"event": "end"}\n'
    )
    events, offset = read(tmp_path)
    assert [e["event"] for e in events] == ["start", "end"]
    assert offset == (tmp_path / EVENTS).stat().st_size


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_hostile_fingerprint_cache_is_ignored(tmp_path, monkeypatch, payload):
    from aner_lang.runtime.io import fingerprint

    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" * 100)
    first = fingerprint.fingerprint(model)
    for cache in (tmp_path / "cache").rglob("*.json"):
        cache.write_text(_document(PAYLOADS[payload][0]))
    assert fingerprint.fingerprint(model) == first == fingerprint.sha256_file(model)


@pytest.fixture
def server() -> Iterator[Callable[[bytes], str]]:
    """A server that answers every request with the given body (its URL)."""
    servers: list[ThreadingHTTPServer] = []

    def start(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        servers.append(ThreadingHTTPServer(("127.0.0.1", 0), Handler))
        threading.Thread(target=servers[-1].serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{servers[-1].server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_hostile_server_reply_is_a_response_error(server, payload):
    from aner_lang.runtime.services import service

    body = '{"object": "list",\n "data": ' + PAYLOADS[payload][0] + "}"
    with pytest.raises(AnerRuntimeError) as info:
        service.connect(server(body.encode()), retries=0)
    assert info.value.code == "E-SERVICE-RESPONSE" and "/v1/models" in info.value.message
