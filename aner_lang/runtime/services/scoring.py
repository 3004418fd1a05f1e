"""`evaluate` on a service: a dataset's loss from the server's log-probabilities.

The loss needs the log-probability the served model gives each scored target token after the
tokens before it. llama.cpp's server offers that: ``POST /tokenize`` gives token ids in the served
model's vocabulary (so the dataset is cut into prompt and completion as for a local model), and
``POST /completion`` reports, for each token it generates, that token's log-probability under the
model's own distribution (``completion_probabilities``, computed from the logits before the
sampler chain, so whatever picks the token does not change its reported probability).

One request scores a whole text: the prompt is the tokens before the first scored target, and a
grammar of token ids (``root ::= <[id]> <[id]> ...``, llama.cpp's GBNF) makes the server generate
exactly the targets from there to the last scored one, one decoding step each. Targets that are
not scored (a user turn between two assistant turns) are generated too and left out of the sum.
Two rules keep it exact:

* The grammar cannot hold an end-of-generation token (the server ends a grammar there), so a
  range of targets ends after each end-of-sequence token; that token is the last one generated,
  picked by a logit bias once the grammar is complete. A text with k end-of-sequence tokens
  before its last scored target takes k + 1 requests.
* A packed row is scored example by example (each starts its own prompt), as a local model
  keeps attention inside each example.

A server that refuses the grammar (a llama.cpp from before token-id grammars, or a target it
cannot generate, such as another end-of-generation token) gets the range one token a request
instead: the prefix, ``n_predict: 1`` and a logit bias that forces the target. Both give the same
numbers. Servers without these endpoints (Ollama, vLLM, hosted APIs) are refused with
E-SERVICE-LOGPROBS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.services.http import field_of
from aner_lang.runtime.services.service import Service
from aner_lang.runtime.tasks.data import Dataset, Example
from aner_lang.runtime.tasks.scores import Evaluation, evaluation

_FORCE = 1000.0
"""A logit bias no other token can beat, so the target is the token sampled."""


def _no_logprobs(service: Service, why: str) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"evaluate: {service.url} does not report log-probabilities of given tokens ({why})",
        code="E-SERVICE-LOGPROBS",
        notes=(
            "evaluate on a service needs llama.cpp's server (its /tokenize and /completion "
            "endpoints); generate and chat work with any OpenAI-compatible server",
        ),
    )


class ServiceTokenizer:
    """The served model's tokenizer, through the server (the `records.TextTokenizer` protocol)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        try:
            props = service.client.get("/props")
        except AnerRuntimeError as e:
            if e.code != "E-SERVICE-HTTP":
                raise
            raise _no_logprobs(service, "it has no /props endpoint") from None
        if not isinstance(props, dict) or "default_generation_settings" not in props:
            raise _no_logprobs(service, "its /props is not llama.cpp's")
        self.bos_id = self._special(props.get("bos_token"))
        self.eos_id = self._special(props.get("eos_token"))
        self.add_bos = len(self.encode("a", add_special=True)) > len(self.encode("a", False))

    def _special(self, text: Any) -> int | None:
        if not isinstance(text, str) or not text:
            return None
        ids = self.encode(text, add_special=False)
        return ids[0] if len(ids) == 1 else None

    def encode(self, text: str, add_special: bool = True, limit: int | None = None) -> list[int]:
        """The server's token ids of `text`; with `limit`, the first `limit` + 1 of them, as
        `Tokenizer.encode` keeps."""
        body = {"content": text, "add_special": add_special, "parse_special": True}
        tokens = field_of(
            self.service.url + "/tokenize", self.service.client.post("/tokenize", body), "tokens"
        )
        ids = [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]
        return ids if limit is None else ids[: limit + 1]


def _generated(service: Service, body: dict[str, Any], targets: list[int]) -> list[float]:
    """The log-probabilities of `targets` in a `/completion` answer to `body`, which must have
    generated exactly them."""
    endpoint = service.url + "/completion"
    reply = service.client.post("/completion", body)
    chosen = field_of(endpoint, reply, "completion_probabilities")
    if not isinstance(chosen, list) or [field_of(endpoint, c, "id") for c in chosen] != targets:
        raise _no_logprobs(service, "it did not score the tokens it was asked to")
    return [float(field_of(endpoint, c, "logprob")) for c in chosen]


def _body(prefix: list[int], n: int) -> dict[str, Any]:
    return {
        "prompt": prefix,
        "n_predict": n,
        "n_probs": 1,
        "temperature": 0.0,
        "cache_prompt": True,
    }


def forced_logprob(service: Service, prefix: list[int], target: int) -> float:
    """log P(target | prefix) under the served model, one request (see the module docstring)."""
    body = {**_body(prefix, 1), "logit_bias": [[target, _FORCE]]}
    return _generated(service, body, [target])[0]


def range_logprobs(
    service: Service, prefix: list[int], targets: list[int], eos: int | None
) -> list[float] | None:
    """log P of each of `targets` after `prefix` and the targets before it, in one request, or
    None when the server refuses the grammar. Only the last target may be `eos`."""
    body = _body(prefix, len(targets))
    forced = targets[:-1] if targets[-1] == eos else targets
    if forced:
        body["grammar"] = "root ::= " + " ".join(f"<[{t}]>" for t in forced)
    if len(forced) < len(targets):
        body["logit_bias"] = [[eos, _FORCE]]
    try:
        return _generated(service, body, targets)
    except AnerRuntimeError as e:
        if e.code in ("E-SERVICE-HTTP", "E-SERVICE-LOGPROBS") and forced:
            return None
        raise


def _example_spans(example: Example) -> Iterator[tuple[int, int]]:
    """[start, end) of each example in a row (one, unless the row is packed)."""
    start = 0
    for length in example.segments or (len(example.ids),):
        yield start, start + length
        start += length


def scoring_ranges(
    ids: tuple[int, ...], scored: tuple[bool, ...], start: int, end: int, eos: int | None
) -> list[tuple[int, int]]:
    """The [a, b) ranges of targets one request each scores for the example ids[start:end]:
    from its first scored target to its last, cut after each `eos` target."""
    positions = [t for t in range(start + 1, end) if scored[t]]
    if not positions:
        return []
    ranges, a = [], positions[0]
    for t in range(a, positions[-1] + 1):
        if ids[t] == eos and t < positions[-1]:
            ranges.append((a, t + 1))
            a = t + 1
    return [*ranges, (a, positions[-1] + 1)]


def evaluate(service: Service, dataset: Dataset) -> Evaluation:
    """Mean next-token loss and perplexity of the served model over the dataset's scored tokens."""
    if service.tokenizer is None:
        service.tokenizer = ServiceTokenizer(service)
    eos = service.tokenizer.eos_id
    total, count = 0.0, 0
    for example in dataset.examples(service.tokenizer):
        ids = list(example.ids)
        for start, end in _example_spans(example):
            for a, b in scoring_ranges(example.ids, example.scored, start, end, eos):
                logprobs = range_logprobs(service, ids[start:a], ids[a:b], eos)
                if logprobs is None:
                    logprobs = [forced_logprob(service, ids[start:t], ids[t]) for t in range(a, b)]
                for t, logprob in zip(range(a, b), logprobs, strict=True):
                    if example.scored[t]:
                        total -= logprob
                        count += 1
    return evaluation(total, count)


def evaluate_builtin(*, model: Service, dataset: Dataset, batch_size: int) -> Evaluation:
    """Builtin `evaluate` on a `Service` (`batch_size` does not apply: one text a request)."""
    return evaluate(model, dataset)
