"""JSON over HTTP to a model server, with the failures a user can act on told apart.

Standard library only (`urllib`), so a script that only uses services needs nothing installed.
Every request has a timeout. Failures that may pass (a timeout, a refused or reset connection, a
429, a 5xx) are retried `retries` times, waiting 0.5 s, 1 s, 2 s, ... between attempts; the
others are reported at once. The API key is read from the environment variable the script names
when the client is made, sent only as an ``Authorization: Bearer`` header, and never appears in
a message: server text quoted in an error has it masked.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from aner_lang.host import json_text
from aner_lang.problems.errors import AnerRuntimeError

_RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_QUOTED = 300
"""Characters of a server's error text shown in a message."""


def _fail(code: str, message: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(message, code=code, notes=notes)


def base_url(url: str) -> str:
    """`url` without a trailing slash or ``/v1`` (paths below add the API prefix they need)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _fail(
            "E-SERVICE-URL",
            f"connect: {url!r} is not an http:// or https:// server address",
            'write it like "http://127.0.0.1:8080" (llama.cpp) or "http://localhost:11434" '
            "(Ollama)",
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass
class Client:
    """Requests to one server (`url` as `base_url` gives it)."""

    url: str
    api_key_env: str | None = None
    timeout: float = 60.0
    retries: int = 2
    backoff: float = 0.5
    _key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise _fail(
                    "E-SERVICE-KEY",
                    f"connect: the environment variable {self.api_key_env} that should hold "
                    "the API key is not set",
                    f"set it before running the script: export {self.api_key_env}=...",
                )
            self._key = key

    def get(self, path: str) -> Any:
        return self._request("GET", path, None)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._request("POST", path, body)

    def _masked(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        endpoint = self.url + path
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode("utf-8")
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last: AnerRuntimeError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(endpoint, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as e:
                last = self._http_error(endpoint, e)
                if e.code in _RETRIED_STATUS:
                    continue
                raise last from None
            except (urllib.error.URLError, OSError) as e:
                last = self._unreachable(endpoint, e)
                continue
            return self._decode(endpoint, raw)
        assert last is not None
        raise last

    def _unreachable(self, endpoint: str, e: OSError) -> AnerRuntimeError:
        """No answer: a timeout, or no connection at all."""
        reason = getattr(e, "reason", e)
        if isinstance(e, TimeoutError) or isinstance(reason, TimeoutError):
            return _fail(
                "E-SERVICE-TIMEOUT",
                f"{endpoint} did not answer within {self.timeout:g} s "
                f"({self.retries + 1} attempt(s))",
                "a long generation may need connect(..., timeout: seconds)",
            )
        return _fail(
            "E-SERVICE-CONNECT",
            f"cannot connect to {self.url}: {reason}",
            "is the server running and listening there? (llama.cpp: llama-server "
            "-m model.gguf --port 8080; Ollama: ollama serve)",
        )

    def _http_error(self, endpoint: str, e: urllib.error.HTTPError) -> AnerRuntimeError:
        try:
            text = e.read().decode("utf-8", errors="replace")
        except OSError:
            text = ""
        quoted = self._masked(" ".join(text.split()))[:_QUOTED]
        if e.code in (401, 403):
            hint = (
                f"the key in {self.api_key_env} was refused"
                if self.api_key_env
                else 'the server wants an API key: connect(url, api_key_env: "NAME") reads it '
                "from the environment variable NAME"
            )
            return _fail("E-SERVICE-AUTH", f"{endpoint}: not authorized (HTTP {e.code})", hint)
        return _fail(
            "E-SERVICE-HTTP",
            f"{endpoint} answered HTTP {e.code} {e.reason}",
            *((f"the server said: {quoted}",) if quoted else ()),
        )

    def _decode(self, endpoint: str, raw: bytes) -> Any:
        try:
            return json_text.loads(raw)
        except ValueError:
            shown = self._masked(raw[:80].decode("utf-8", errors="replace"))
            raise _fail(
                "E-SERVICE-RESPONSE",
                f"{endpoint} answered with something that is not JSON: {shown!r}",
                "is this address an OpenAI-compatible model server?",
            ) from None


def field_of(endpoint: str, response: Any, *path: str | int) -> Any:
    """`response[path[0]][path[1]]...`, or an E-SERVICE-RESPONSE naming what is missing."""
    value = response
    for step in path:
        try:
            value = value[step]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{s!r}]" for s in path)
            raise _fail(
                "E-SERVICE-RESPONSE",
                f"{endpoint} answered without the expected field {where}",
                "is this address an OpenAI-compatible model server?",
            ) from None
    return value
