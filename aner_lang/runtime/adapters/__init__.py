"""Adapter methods and the builtin implementations that construct them.

Every builtin takes keyword arguments as the registry declares them (aner_lang/builtins/train.py).
`adapter_from_config` rebuilds an adapter from its JSON config (checkpoints, load_adapter);
`adapter_from_state` also restores its tensors and training state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from aner_lang.grammar.limits import INT_MAX, INT_MIN
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.base import Adapter
from aner_lang.runtime.adapters.full import Full
from aner_lang.runtime.adapters.lora import DoRA, LoRA, LoRAFA
from aner_lang.runtime.adapters.tinylora import TinyLoRA

__all__ = [
    "Adapter",
    "adapter_from_config",
    "adapter_from_state",
    "dora",
    "full",
    "lora",
    "lora_fa",
    "tinylora",
]

_LOW_RANK = {"lora": LoRA, "lora_fa": LoRAFA, "dora": DoRA}


def _check_rank(rank: int, alpha: float | None = None, dropout: float = 0.0) -> None:
    if rank < 1:
        raise AnerRuntimeError(f"rank must be at least 1, got {rank}", code="E-ADAPTER-RANK")
    if alpha is not None and alpha <= 0:
        raise AnerRuntimeError(f"alpha must be positive, got {alpha}", code="E-ADAPTER-ALPHA")
    if not 0.0 <= dropout < 1.0:
        raise AnerRuntimeError(
            f"dropout must be in [0, 1), got {dropout}", code="E-ADAPTER-DROPOUT"
        )


def _low_rank(
    method: str,
    model: Any,
    rank: int,
    alpha: float,
    dropout: float,
    targets: Sequence[str],
    seed: int,
) -> Adapter:
    _check_rank(rank, alpha, dropout)
    return _LOW_RANK[method](model, rank, alpha, dropout, list(targets), seed)


def lora(
    model: Any,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Adapter:
    """Builtin `lora`: QLoRA-style low-rank adapter (A and B trained)."""
    return _low_rank("lora", model, rank, alpha, dropout, targets, seed)


def lora_fa(
    model: Any,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Adapter:
    """Builtin `lora_fa`: A frozen at init, B trained."""
    return _low_rank("lora_fa", model, rank, alpha, dropout, targets, seed)


def dora(
    model: Any,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Adapter:
    """Builtin `dora`: LoRA direction plus trainable row magnitude."""
    return _low_rank("dora", model, rank, alpha, dropout, targets, seed)


def tinylora(
    model: Any,
    parameters: int = 13,
    sharing: str = "global",
    rank: int = 2,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Adapter:
    """Builtin `tinylora`: `parameters` trainable numbers over fixed SVD bases."""
    _check_rank(rank)
    if parameters < 1:
        raise AnerRuntimeError(
            f"parameters must be at least 1, got {parameters}", code="E-ADAPTER-PARAMETERS"
        )
    if sharing not in ("global", "per_module"):
        raise AnerRuntimeError(
            f"sharing must be global or per_module, got {sharing!r}", code="E-ADAPTER-SHARING"
        )
    return TinyLoRA(model, parameters, sharing, rank, list(targets), seed)


def full(model: Any) -> Adapter:
    """Builtin `full`: every base weight trainable (dense storage only)."""
    return Full(model)


def adapter_from_config(model: Any, config: Any) -> Adapter:
    """Rebuild an adapter of `model` from `Adapter.config` (tensors re-initialised); the config
    comes from a file, so it is checked first."""
    cfg = dict(config) if isinstance(config, dict) else {}
    method = cfg.pop("method", None)
    makers: dict[str, Callable[..., Adapter]] = {
        "lora": lora,
        "lora_fa": lora_fa,
        "dora": dora,
        "tinylora": tinylora,
        "full": full,
    }
    if not isinstance(method, str) or method not in makers:
        raise AnerRuntimeError(f"unknown adapter method {method!r}", code="E-ADAPTER-METHOD")
    _check_config(method, makers[method], cfg)
    return makers[method](model, **cfg)


_KINDS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "Sequence[str]": (list,),
}
"""The JSON form of each parameter type of an adapter maker."""


def _check_config(method: str, maker: Callable[..., Adapter], cfg: dict[str, Any]) -> None:
    """Every key of a saved configuration is a parameter of `maker`, with a value of its type: a
    file's configuration reaches the maker only once it is one a script could have written."""
    params = inspect.signature(maker).parameters
    for key, value in cfg.items():
        param = params.get(key) if key != "model" else None
        kinds = _KINDS.get(str(param.annotation)) if param is not None else None
        ok = (
            kinds is not None
            and isinstance(value, kinds)
            and not isinstance(value, bool)
            and (not isinstance(value, int) or INT_MIN <= value <= INT_MAX)
            and (not isinstance(value, list) or all(isinstance(v, str) for v in value))
        )
        if not ok:
            raise AnerRuntimeError(
                f"the saved {method} configuration has {key!r}: {str(value)[:40]!r}, which "
                f"{method} does not take",
                code="E-ADAPTER-CONFIG",
                notes=(f"{method} takes {', '.join(p for p in params if p != 'model')}",),
            )


def adapter_from_state(model: Any, state: Any) -> Adapter:
    """The adapter a `TrainState` describes, with its tensors and state restored exactly."""
    adapter = adapter_from_config(model, state.meta["adapter"])
    adapter.load_tensors(
        {k[len("adapter/") :]: v for k, v in state.tensors.items() if k.startswith("adapter/")}
    )
    adapter.state = state
    return adapter
