"""Text generation with a KV cache: greedy, or seeded temperature / nucleus (top-p) sampling.

Works on anything with the forward protocol (`forward(ids, cache)`, `tokenizer`, `device`,
`base`), so an adapter generates exactly like its base model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aner_lang.problems.errors import AnerRuntimeError


@dataclass(frozen=True)
class Sampling:
    """How to pick the next token: temperature 0 is greedy (argmax)."""

    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise AnerRuntimeError(
                f"max_tokens must be at least 1, got {self.max_tokens}", code="E-GENERATE"
            )
        if self.temperature < 0:
            raise AnerRuntimeError(
                f"temperature must be >= 0, got {self.temperature}", code="E-GENERATE"
            )
        if not 0 < self.top_p <= 1:
            raise AnerRuntimeError(f"top_p must be in (0, 1], got {self.top_p}", code="E-GENERATE")


def _pick(logits: torch.Tensor, s: Sampling, rng: torch.Generator) -> int:
    if s.temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / s.temperature, dim=-1)
    if s.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = sorted_p.cumsum(0) - sorted_p < s.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=rng))


def generate_ids(model: Any, prompt_ids: Sequence[int], sampling: Sampling) -> list[int]:
    """New token ids after `prompt_ids` (prompt excluded), stopping at EOS when asked."""
    sampling.validate()
    if not prompt_ids:
        raise AnerRuntimeError("generate: the prompt is empty", code="E-GENERATE")
    base = model.base
    context = base.config.max_position_embeddings
    if len(prompt_ids) >= context:
        raise AnerRuntimeError(
            f"generate: the prompt has {len(prompt_ids)} tokens, the model's context is {context}",
            code="E-CONTEXT",
        )
    budget = min(sampling.max_tokens, context - len(prompt_ids))
    stops = model.tokenizer.stop_ids if sampling.stop_at_eos else frozenset()
    rng = torch.Generator().manual_seed(sampling.seed)
    cache = base.new_cache()
    out: list[int] = []
    step = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)
    with torch.no_grad():
        for _ in range(budget):
            token = _pick(model.forward(step, cache)[0, -1], sampling, rng)
            if token in stops:
                break
            out.append(token)
            step = torch.tensor([[token]], dtype=torch.long, device=model.device)
    return out


def generate_text(model: Any, prompt: str, sampling: Sampling) -> str:
    tok = model.tokenizer
    return tok.decode(generate_ids(model, tok.encode(prompt), sampling), skip_special=True)


def chat_text(model: Any, message: str, system: str | None, sampling: Sampling) -> str:
    """Reply to one user message, rendered with the model's GGUF chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}
    ]
    tok = model.tokenizer
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(prompt, add_special=False)
    return tok.decode(generate_ids(model, ids, sampling), skip_special=True)


def generate_builtin(
    model: Any,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    stop_at_eos: bool,
) -> str:
    """Builtin `generate(model, prompt, max_tokens:, temperature:, top_p:, seed:, ...)`."""
    return generate_text(model, prompt, Sampling(max_tokens, temperature, top_p, seed, stop_at_eos))


def chat_builtin(
    model: Any,
    message: str,
    system: str | None,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> str:
    """Builtin `chat(model, message, system:, max_tokens:, temperature:, top_p:, seed:)`."""
    return chat_text(model, message, system, Sampling(max_tokens, temperature, top_p, seed))
