"""llama.cpp's own server, started from Python, for tests and benchmarks: the real consumer of
Aner's GGUF exports and the real OpenAI-compatible service `connect(...)` talks to.

`xllamacpp` (PyPI, a prebuilt CPU build of llama.cpp with its HTTP server) serves a GGUF file,
optionally with LoRA adapters, on a free localhost port; `llama_server` yields its base URL
(``http://127.0.0.1:PORT``) and stops it afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def llama_server(
    model: str | Path,
    *,
    loras: Sequence[str | Path] = (),
    context: int = 512,
    threads: int | None = None,
) -> Iterator[str]:
    """A llama.cpp server for `model` (with `loras` applied at scale 1) on localhost."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.n_ctx = context
    params.n_parallel = 1
    params.port = 0  # a free port
    params.verbosity = -1
    params.warmup = False
    n = threads or min(4, os.cpu_count() or 1)
    params.cpuparams.n_threads = n
    params.cpuparams_batch.n_threads = n
    params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(str(p), 1.0) for p in loras]
    server = xllamacpp.Server(params)
    try:
        yield str(server.listening_address)
    finally:
        del server


def complete(url: str, prompt: str, tokens: int) -> str:
    """The server's greedy completion of `prompt` (`tokens` at most), via /v1/completions."""
    import json
    import urllib.request

    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0.0}
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return str(json.loads(response.read())["choices"][0]["text"])


def served(
    model: str | Path, prompts: Sequence[str], tokens: int, loras: Sequence[str | Path] = ()
) -> list[str]:
    """llama.cpp's greedy completions of `prompts` with `model` (and `loras` at scale 1)."""
    with llama_server(model, loras=loras) as url:
        return [complete(url, p, tokens) for p in prompts]


def next_token_logprobs(url: str, ids: list[int]) -> dict[int, float] | None:
    """llama.cpp's log-probabilities of its 5 likeliest next tokens after `ids` (None when its
    pick is part of a UTF-8 character: the server withholds them then)."""
    import json
    import urllib.request

    body = {"prompt": ids, "n_predict": 1, "n_probs": 5, "temperature": 0.0, "cache_prompt": False}
    request = urllib.request.Request(
        url + "/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.loads(response.read())
    if "completion_probabilities" not in reply:
        return None
    top = reply["completion_probabilities"][0]["top_logprobs"]
    return {int(t["id"]): float(t["logprob"]) for t in top}
