"""Service failures, injected by a small fake server: timeouts, 5xx (retried with backoff), non-JSON
and malformed answers, refused keys (never shown), unreachable servers, servers without
log-probabilities. The happy path is tested against llama.cpp's real server (test_llamacpp)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.services import scoring, service
from aner_lang.runtime.tasks.data import from_texts

SECRET = "sk-aner-test-0123456789"
MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
COMPLETION = {"choices": [{"text": " Paris.", "index": 0}]}

Behaviour = Callable[[BaseHTTPRequestHandler, int], tuple[int, bytes] | None]
"""(request handler, how many requests came to this path before) -> (status, body), or None to
never answer."""


class FakeServer:
    def __init__(self, routes: dict[str, Behaviour]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                count = sum(1 for p, _, _ in fake.seen if p == self.path)
                fake.seen.append((self.path, body, dict(self.headers)))
                route = fake.routes.get(self.path)
                result = route(self, count) if route else (404, b'{"error": "not found"}')
                if result is None:
                    time.sleep(3)
                    return
                status, payload = result
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def requests_to(self, path: str) -> int:
        return sum(1 for p, _, _ in self.seen if p == path)


def ok(payload: object) -> Behaviour:
    return lambda handler, count: (200, json.dumps(payload).encode())


@pytest.fixture
def fake() -> Iterator[Callable[[dict[str, Behaviour]], FakeServer]]:
    servers: list[FakeServer] = []

    def start(routes: dict[str, Behaviour]) -> FakeServer:
        servers.append(FakeServer({"/v1/models": ok(MODELS), **routes}))
        return servers[-1]

    yield start
    for s in servers:
        s.httpd.shutdown()


def _code(fn: Callable[[], object]) -> AnerRuntimeError:
    with pytest.raises(AnerRuntimeError) as info:
        fn()
    return info.value


def test_a_server_that_never_answers_times_out_after_its_retries(fake) -> None:
    server = fake({"/v1/completions": lambda h, n: None})
    llm = service.connect(server.url, timeout=0.3, retries=1)
    error = _code(lambda: service.generate(llm, "The capital of France is"))
    assert error.code == "E-SERVICE-TIMEOUT" and "0.3 s (2 attempt(s))" in error.message
    assert server.requests_to("/v1/completions") == 2


def test_server_errors_are_retried_with_backoff_until_one_succeeds(fake) -> None:
    flaky = lambda h, n: (503, b"busy") if n < 2 else (200, json.dumps(COMPLETION).encode())  # noqa: E731
    server = fake({"/v1/completions": flaky})
    llm = service.connect(server.url, retries=2)
    start = time.monotonic()
    assert service.generate(llm, "The capital of France is") == " Paris."
    assert server.requests_to("/v1/completions") == 3
    assert time.monotonic() - start >= 0.5 + 1.0  # waited 0.5 s, then 1 s


def test_a_lasting_server_error_is_reported_with_what_the_server_said(fake) -> None:
    server = fake({"/v1/completions": lambda h, n: (500, b'{"error": "model crashed"}')})
    llm = service.connect(server.url, retries=1)
    error = _code(lambda: service.generate(llm, "Hi"))
    assert error.code == "E-SERVICE-HTTP" and "HTTP 500" in error.message
    assert 'the server said: {"error": "model crashed"}' in error.notes
    assert server.requests_to("/v1/completions") == 2


def test_a_client_error_is_not_retried(fake) -> None:
    server = fake({"/v1/completions": lambda h, n: (404, b'{"error": "no such model"}')})
    llm = service.connect(server.url, model="nonexistent", retries=3)
    assert _code(lambda: service.generate(llm, "Hi")).code == "E-SERVICE-HTTP"
    assert server.requests_to("/v1/completions") == 1
    sent = json.loads(server.seen[-1][1])
    assert sent["model"] == "nonexistent" and sent["temperature"] == 0.0


@pytest.mark.parametrize(
    ("answer", "where"),
    [(b"<html>It works!</html>", "not JSON"), (b'{"result": "Paris"}', "['choices'][0]['text']")],
)
def test_an_answer_that_is_not_an_openai_one_is_named(fake, answer: bytes, where: str) -> None:
    server = fake({"/v1/completions": lambda h, n: (200, answer)})
    error = _code(lambda: service.generate(service.connect(server.url), "Hi"))
    assert error.code == "E-SERVICE-RESPONSE" and where in error.message


def test_the_key_is_sent_as_a_bearer_token_and_never_shown(fake, monkeypatch) -> None:
    monkeypatch.setenv("ANER_TEST_KEY", SECRET)

    def refuse(handler: BaseHTTPRequestHandler, count: int) -> tuple[int, bytes]:
        echoed = {"error": f"invalid key {handler.headers['Authorization']}"}
        return 401, json.dumps(echoed).encode()

    server = fake({"/v1/chat/completions": refuse})
    llm = service.connect(server.url, api_key_env="ANER_TEST_KEY")
    assert server.seen[0][2]["Authorization"] == f"Bearer {SECRET}"
    error = _code(lambda: service.chat(llm, "Hello"))
    assert error.code == "E-SERVICE-AUTH" and "ANER_TEST_KEY" in error.notes[0]
    shown = " ".join((error.message, *error.notes, repr(llm)))
    assert SECRET not in shown and "ANER_TEST_KEY" in repr(llm)
    # a quoted server message has the key masked
    monkeypatch.setenv("ANER_TEST_KEY", SECRET)
    echo = fake({"/v1/completions": lambda h, n: (400, f"bad request from {SECRET}".encode())})
    error = _code(
        lambda: service.generate(service.connect(echo.url, api_key_env="ANER_TEST_KEY"), "x")
    )
    assert SECRET not in " ".join(error.notes) and "***" in " ".join(error.notes)


def test_no_key_where_the_server_wants_one(fake) -> None:
    server = fake({"/v1/models": lambda h, n: (401, b'{"error": "missing key"}')})
    error = _code(lambda: service.connect(server.url))
    assert error.code == "E-SERVICE-AUTH" and "api_key_env" in error.notes[0]


def test_a_missing_key_variable_fails_before_any_request(fake, monkeypatch) -> None:
    monkeypatch.delenv("ANER_TEST_KEY", raising=False)
    server = fake({})
    error = _code(lambda: service.connect(server.url, api_key_env="ANER_TEST_KEY"))
    assert error.code == "E-SERVICE-KEY" and not server.seen


def test_an_unreachable_server_is_named(fake) -> None:
    closed = fake({})
    closed.httpd.shutdown()
    closed.httpd.server_close()
    error = _code(lambda: service.connect(closed.url, retries=0))
    assert error.code == "E-SERVICE-CONNECT" and closed.url in error.message
    assert _code(lambda: service.connect("localhost:8080")).code == "E-SERVICE-URL"


def test_evaluate_refuses_a_server_without_log_probabilities(fake) -> None:
    server = fake({})
    llm = service.connect(server.url + "/v1/")
    assert llm.url == server.url and llm.model == "fake-model"
    error = _code(lambda: scoring.evaluate(llm, from_texts(["The quiet lake."], 16)))
    assert error.code == "E-SERVICE-LOGPROBS"
