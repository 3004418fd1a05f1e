"""`connect(url, ...)`: a model behind an OpenAI-compatible server, and `generate` / `chat` on it.

A `Service` is what an Aner `Service` value is. `connect` asks the server for its models
(``GET /v1/models``) at once, so a wrong address, a server that is down or a refused key fails
at the `connect` line; without `model:` the first model the server lists is used (llama.cpp
serves one; Ollama and vLLM need a name in every request). `generate` uses
``POST /v1/completions`` and `chat` ``POST /v1/chat/completions`` with the same sampling
arguments as a local model (temperature 0 is greedy); `evaluate` is `scoring`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aner_lang.runtime.services.http import Client, base_url, field_of


@dataclass
class Service:
    """A model on a server (what `connect` returns)."""

    client: Client
    model: str
    tokenizer: Any = None
    """The server's tokenizer, made by the first `evaluate` (`scoring.ServiceTokenizer`)."""

    @property
    def url(self) -> str:
        return self.client.url

    def completion_body(
        self, max_tokens: int, temperature: float, top_p: float, seed: int
    ) -> dict[str, Any]:
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
        }

    def __repr__(self) -> str:
        key = f", key from ${self.client.api_key_env}" if self.client.api_key_env else ""
        return f"Service({self.model!r} at {self.url}{key})"


def connect(
    url: str,
    model: str | None = None,
    api_key_env: str | None = None,
    timeout: float = 60.0,
    retries: int = 2,
) -> Service:
    """A `Service` for `model` on the server at `url` (checked now: see the module docstring)."""
    client = Client(base_url(url), api_key_env, timeout, retries)
    endpoint = "/v1/models"
    listed = field_of(client.url + endpoint, client.get(endpoint), "data")
    if model is None:
        model = str(field_of(client.url + endpoint, listed, 0, "id"))
    return Service(client, model)


def generate(
    service: Service,
    prompt: str,
    max_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_at_eos: bool = True,
) -> str:
    """The server's continuation of `prompt` (new text only)."""
    body = {"prompt": prompt, **service.completion_body(max_tokens, temperature, top_p, seed)}
    if not stop_at_eos:
        body["ignore_eos"] = True  # llama.cpp's and vLLM's extension; OpenAI has no such switch
    endpoint = "/v1/completions"
    return str(
        field_of(service.url + endpoint, service.client.post(endpoint, body), "choices", 0, "text")
    )


def chat(
    service: Service,
    message: str,
    system: str | None = None,
    max_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> str:
    """The server's reply to one user message (the server applies its chat template)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}
    ]
    body = {"messages": messages, **service.completion_body(max_tokens, temperature, top_p, seed)}
    endpoint = "/v1/chat/completions"
    reply = service.client.post(endpoint, body)
    return str(field_of(service.url + endpoint, reply, "choices", 0, "message", "content"))


def connect_builtin(
    *, url: str, model: str | None, api_key_env: str | None, timeout: float, retries: int
) -> Service:
    """Builtin `connect`."""
    return connect(url, model, api_key_env, timeout, retries)


def generate_builtin(*, model: Service, **sampling: Any) -> str:
    """Builtin `generate` on a `Service`."""
    return generate(model, **sampling)


def chat_builtin(*, model: Service, **arguments: Any) -> str:
    """Builtin `chat` on a `Service`."""
    return chat(model, **arguments)
