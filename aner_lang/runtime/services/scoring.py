"""`evaluate` on a service: a dataset's loss from the server's log-probabilities.

The loss needs the log-probability the served model gives each scored target token after the
tokens before it. llama.cpp's server offers exactly that: ``POST /tokenize`` gives token ids in the
served model's vocabulary (so the dataset is cut into prompt and completion as for a local model),
and ``POST /completion`` with the prefix as token ids, ``n_predict: 1``, ``n_probs: 1`` and a
logit bias that forces the target reports the target's log-probability under the model's own
distribution: llama.cpp computes ``completion_probabilities`` from the logits before the sampler
chain, so the bias that picks the token does not change its reported probability. That is one
request per scored token; the server's prompt cache turns each into a one-token step. Servers
without these endpoints (Ollama, vLLM, hosted APIs) are refused with E-SERVICE-LOGPROBS.
"""

from __future__ import annotations

from typing import Any

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.services.http import field_of
from aner_lang.runtime.services.service import Service
from aner_lang.runtime.tasks.data import Dataset
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

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": True}
        tokens = field_of(
            self.service.url + "/tokenize", self.service.client.post("/tokenize", body), "tokens"
        )
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]


def forced_logprob(service: Service, prefix: list[int], target: int) -> float:
    """log P(target | prefix) under the served model (see the module docstring)."""
    body = {
        "prompt": prefix,
        "n_predict": 1,
        "n_probs": 1,
        "temperature": 0.0,
        "logit_bias": [[target, _FORCE]],
        "cache_prompt": True,
    }
    endpoint = service.url + "/completion"
    reply = service.client.post("/completion", body)
    chosen = field_of(endpoint, reply, "completion_probabilities", 0)
    if field_of(endpoint, chosen, "id") != target:
        raise _no_logprobs(service, "it did not score the token it was asked to")
    return float(field_of(endpoint, chosen, "logprob"))


def evaluate(service: Service, dataset: Dataset) -> Evaluation:
    """Mean next-token loss and perplexity of the served model over the dataset's scored tokens."""
    if service.tokenizer is None:
        service.tokenizer = ServiceTokenizer(service)
    total, count = 0.0, 0
    for example in dataset.examples(service.tokenizer):
        ids = list(example.ids)
        for t in range(1, len(ids)):
            if example.scored[t]:
                total -= forced_logprob(service, ids[:t], ids[t])
                count += 1
    return evaluation(total, count)


def evaluate_builtin(*, model: Service, dataset: Dataset, batch_size: int) -> Evaluation:
    """Builtin `evaluate` on a `Service` (`batch_size` does not apply: one token a request)."""
    return evaluate(model, dataset)
