"""Adapters on disk: PEFT's format (for the HF ecosystem) and Aner's own (for every method).

`save_adapter(adapter, dir, format: peft)` writes `adapter_config.json` and
`adapter_model.safetensors` exactly as `peft` names them
(`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, DoRA's
`...lora_magnitude_vector`), so `peft.PeftModel.from_pretrained(hf_model, dir)` computes our logits.
A LoRA on mixture-of-experts experts is written as PEFT's `target_parameters` LoRA of transformers'
3-D expert parameters (`peft_experts`). LoRA-FA is a LoRA whose A happened to be frozen; TinyLoRA's
delta `U diag(S) R Vh` is written as the exact rank-r LoRA with `B = U diag(S) R`, `A = Vh` and
scaling 1.
`format: safetensors` writes `adapter.safetensors` + `adapter.json` (the adapter's config and
its base's fingerprint); it covers every method, `full` included, and reloads bit for bit.

`load_adapter(model, dir)` reads either format back onto a base model.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aner_lang.host import files, json_text
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters import peft_experts
from aner_lang.runtime.io.fingerprint import fingerprint
from aner_lang.runtime.io.world import once

FORMATS = ("peft", "safetensors")
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
ANER_CONFIG, ANER_WEIGHTS = "adapter.json", "adapter.safetensors"
_PEFT_PREFIX = "base_model.model.model."
# our tensor suffix -> PEFT's, for the low-rank methods
_PEFT_SUFFIX = {
    "lora_A": "lora_A.weight",
    "lora_B": "lora_B.weight",
    "lora_magnitude": "lora_magnitude_vector",
}


def _fail(
    directory: Path, what: str, code: str = "E-ADAPTER-FILE", *notes: str
) -> AnerRuntimeError:
    return AnerRuntimeError(f"adapter {directory}: {what}", code=code, notes=notes)


def _tinylora_as_lora(adapter: Any) -> dict[str, torch.Tensor]:
    """TinyLoRA's delta of every target as an exact rank-r LoRA pair (scaling 1)."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for index, (name, _) in enumerate(adapter.targets):
            u, s, vh, proj = (t.detach().float().cpu() for t in adapter._bases[index])
            r = torch.einsum("i,ijk->jk", adapter._v[index].detach().float().cpu(), proj)
            out[f"{name}.lora_A"] = vh.contiguous()
            out[f"{name}.lora_B"] = ((u * s) @ r).contiguous()
    return out


def _peft_parts(adapter: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(PEFT state dict, LoraConfig fields) of a low-rank adapter."""
    cfg = adapter.config
    method = adapter.method
    if method == "tinylora":
        ours, rank, alpha, dropout = _tinylora_as_lora(adapter), cfg["rank"], cfg["rank"], 0.0
    elif method in ("lora", "lora_fa", "dora"):
        ours, rank, alpha, dropout = adapter.tensors(), cfg["rank"], cfg["alpha"], cfg["dropout"]
    else:
        raise AnerRuntimeError(
            f"a {method} adapter has no PEFT LoRA form",
            code="E-EXPORT",
            notes=(
                "use format: safetensors, or export_gguf(merge(adapter), "
                "path) for a standalone model",
            ),
        )
    _check_experts(adapter, dropout)
    experts = peft_experts.pack(ours, rank, alpha)
    tensors = {f"{_PEFT_PREFIX}{k}": t for k, t in experts.tensors.items()}
    for key, t in ours.items():
        module, kind = key.rsplit(".", 1)
        if not peft_experts.is_expert(module):
            tensors[f"{_PEFT_PREFIX}{module}.{_PEFT_SUFFIX[kind]}"] = t.float().contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(rank),
        "lora_alpha": float(alpha),
        "lora_dropout": float(dropout),
        "target_modules": sorted(
            {n.rsplit(".", 1)[1] for n, _ in adapter.targets if not peft_experts.is_expert(n)}
        ),
        "target_parameters": experts.target_parameters or None,
        "rank_pattern": experts.rank_pattern,
        "alpha_pattern": experts.alpha_pattern,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": method == "dora",
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": adapter.base.reference,
    }
    return tensors, config


def _check_experts(adapter: Any, dropout: float) -> None:
    """An adapter on experts has a PEFT form only without dropout and DoRA (PEFT's
    `ParamWrapper` refuses both), and only where no dense MLP layer is adapted beside them: PEFT
    reads `target_modules` gate_proj/up_proj/down_proj of a mixture-of-experts model as the
    names of its experts (transformers 4's layout) and moves them to `target_parameters`, so a
    dense layer's MLP LoRA (Qwen3-MoE's `mlp_only_layers`) would be dropped."""
    names = [n for n, _ in adapter.targets]
    expert = next((n for n in names if peft_experts.is_expert(n)), None)
    if expert is None:
        return
    dense = sorted(
        {n.split(".")[1] for n in names if ".mlp." in n and not peft_experts.is_expert(n)}, key=int
    )
    reasons = (
        (adapter.method == "dora", "DoRA, which PEFT's LoRA of expert parameters lacks"),
        (dropout > 0, "LoRA dropout, which PEFT's LoRA of expert parameters lacks"),
        (
            bool(dense),
            f"the dense MLP of layers {', '.join(dense)} adapted too, whose LoRA PEFT would "
            "drop: it reads a mixture-of-experts model's MLP target_modules as its experts",
        ),
    )
    for refused, why in reasons:
        if refused:
            raise AnerRuntimeError(
                f"the {adapter.method} adapter adapts mixture-of-experts experts ({expert}, ...) "
                f"with {why}; PEFT cannot load it",
                code="E-EXPORT",
                notes=(
                    "use format: safetensors, export_hf(merge(adapter), dir) for a merged "
                    "Hugging Face folder, or, for PEFT, a lora with dropout: 0 whose MLP "
                    "targets are all experts",
                ),
            )


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    save_file(tensors, str(path), metadata={"format": "pt", **meta})


def save_adapter(
    adapter: Any, directory: str | Path, format: str = "peft", *, overwrite: bool = False
) -> Path:
    """Write `adapter` under `directory` in `format` (peft or safetensors); return the folder.

    The files are written into a temporary sibling folder and moved into place together, so the
    folder never holds half an adapter. A folder that holds anything is written only with
    `overwrite` (and then only the adapter's own files are replaced); the base model's own
    folder or file never (`aner_lang.host.files`)."""
    if format not in FORMATS:
        raise AnerRuntimeError(
            f"unknown adapter format {format!r}; expected one of {', '.join(FORMATS)}",
            code="E-EXPORT",
        )
    if not hasattr(adapter, "params"):
        raise AnerRuntimeError(
            "save_adapter needs an adapter (from lora, lora_fa, tinylora, dora or full)",
            code="E-EXPORT",
        )
    with files.replacing(
        directory, overwrite=overwrite, protected=[adapter.base.path], folder=True
    ) as tmp:
        _write_folder(adapter, tmp, format)
    return Path(directory)


def _write_folder(adapter: Any, out: Path, format: str) -> None:
    """The adapter's files in `format`, written into the (new, empty) folder `out`."""
    base_sha = fingerprint(adapter.base.path)
    meta = {"aner_method": adapter.method, "aner_base_sha256": base_sha}
    if format == "peft":
        tensors, config = _peft_parts(adapter)
        _write_tensors(out / PEFT_WEIGHTS, tensors, meta)
        _write_json(out / PEFT_CONFIG, config)
    else:
        _write_tensors(out / ANER_WEIGHTS, adapter.tensors(), meta)
        _write_json(
            out / ANER_CONFIG,
            {
                "format": "aner-adapter",
                "version": 1,
                "config": adapter.config,
                "base": {"name": adapter.base.name, "sha256": base_sha},
            },
        )


JSON_LIMIT = 16 * files.MiB
"""An adapter's JSON config."""
WEIGHTS_LIMIT = files.DATA_LIMIT
"""An adapter's safetensors file (a `full` adapter is as large as its model)."""


def _file_error(directory: Path, name: str, e: AnerRuntimeError) -> AnerRuntimeError:
    """A refused read of the adapter file `name` (`aner_lang.host.files`), keeping its code."""
    return _fail(directory, f"{name}: {e.message.removeprefix(f'{directory / name}: ')}", e.code)


def _read_json(directory: Path, name: str) -> dict[str, Any]:
    try:
        obj = json_text.loads(files.read_text(directory / name, JSON_LIMIT))
    except AnerRuntimeError as e:
        raise _file_error(directory, name, e) from None
    except ValueError as e:
        raise _fail(directory, f"{name} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise _fail(directory, f"{name} is not a JSON object")
    return obj


def _read_tensors(directory: Path, name: str) -> dict[str, torch.Tensor]:
    try:
        files.regular_size(directory / name, WEIGHTS_LIMIT)
        return load_file(str(directory / name))
    except AnerRuntimeError as e:
        raise _file_error(directory, name, e) from None
    except (OSError, SafetensorError) as e:
        raise _fail(directory, f"{name} cannot be read ({e})") from None


def _field(directory: Path, cfg: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """`cfg[key]` (or `default` when absent or null), which must be of `kind` (an int is a
    float too; a bool is not a number)."""
    value = cfg.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise _fail(
            directory,
            f"{PEFT_CONFIG}: {key} is {json.dumps(value)[:40]}, not {_KIND_NAMES[kind]}",
            "E-ADAPTER-PEFT",
        )
    return value


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _fill(directory: Path, adapter: Any, tensors: dict[str, torch.Tensor]) -> Any:
    try:
        adapter.load_tensors(tensors)
    except AnerRuntimeError as e:
        raise _fail(directory, e.message, e.code) from None
    return adapter


def _load_aner(model: Any, directory: Path) -> Any:
    from aner_lang.runtime.adapters import adapter_from_config

    meta = _read_json(directory, ANER_CONFIG)
    want = (meta.get("base") or {}).get("sha256")
    if want != fingerprint(model.path):
        raise _fail(
            directory,
            f"it was trained on a different base model "
            f"({(meta.get('base') or {}).get('name')!r}, sha256 {str(want)[:12]}...), "
            f"not {model.name!r}",
            "E-ADAPTER-BASE",
        )
    return _fill(
        directory,
        adapter_from_config(model, meta.get("config") or {}),
        _read_tensors(directory, ANER_WEIGHTS),
    )


def _load_peft(model: Any, directory: Path) -> Any:
    from aner_lang.runtime.adapters import dora, lora

    known = model.architecture.targets

    cfg = _read_json(directory, PEFT_CONFIG)
    if cfg.get("peft_type") != "LORA":
        raise _fail(
            directory,
            f"peft_type {cfg.get('peft_type')!r} is not supported (LORA is)",
            "E-ADAPTER-PEFT",
        )
    for key in ("modules_to_save", "layers_to_transform"):
        if cfg.get(key):
            raise _fail(directory, f"PEFT option {key} is not supported", "E-ADAPTER-PEFT")
    if cfg.get("fan_in_fan_out") or cfg.get("bias", "none") != "none":
        raise _fail(directory, "fan_in_fan_out and LoRA biases are not supported", "E-ADAPTER-PEFT")
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else targets
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _fail(
            directory, f"{PEFT_CONFIG}: target_modules is not a list of names", "E-ADAPTER-PEFT"
        )
    parameters = _target_parameters(directory, cfg)
    unknown = [t for t in targets if t not in known]
    if unknown:
        raise _fail(
            directory,
            f"target modules {unknown} are not projections of this {model.architecture.name} model",
            "E-ADAPTER-PEFT",
            f"supported: {', '.join(known)}",
        )
    rank = _field(directory, cfg, "r", int, 8)
    alpha = _field(directory, cfg, "lora_alpha", float, 8.0)
    patterns = {key: _pattern(directory, cfg, key) for key in ("rank_pattern", "alpha_pattern")}
    if _field(directory, cfg, "use_rslora", bool, False):  # alpha / sqrt(r) == alpha*sqrt(r) / r
        if any(patterns.values()):
            raise _fail(directory, "use_rslora with rank or alpha patterns", "E-ADAPTER-PEFT")
        alpha *= math.sqrt(rank)
    make = dora if _field(directory, cfg, "use_dora", bool, False) else lora
    held = {t for p in parameters for t in peft_experts.targets_of(p)}
    adapter = make(
        model,
        rank=rank,
        alpha=alpha,
        dropout=_field(directory, cfg, "lora_dropout", float, 0.0),
        targets=[t for t in known if t in targets or t in held],
    )
    widths = _widths(directory, adapter, rank, alpha, patterns)
    ours, packed = {}, {}
    back = {v: k for k, v in _PEFT_SUFFIX.items()}
    for key, t in _read_tensors(directory, PEFT_WEIGHTS).items():
        if peft_experts.is_packed(key.removeprefix(_PEFT_PREFIX)):
            packed[key.removeprefix(_PEFT_PREFIX)] = t
            continue
        module, _, suffix = key.removeprefix(_PEFT_PREFIX).partition(".lora_")
        kind = back.get("lora_" + suffix)
        if kind is None:
            raise _fail(directory, f"unexpected tensor {key!r}", "E-ADAPTER-PEFT")
        ours[f"{module}.{kind}"] = t
    try:
        ours.update(peft_experts.unpack(packed, parameters, rank, widths))
    except peft_experts.NotOurs as e:
        raise _fail(directory, f"{PEFT_WEIGHTS}: {e}", "E-ADAPTER-PEFT") from None
    return _fill(directory, adapter, ours)


def _target_parameters(directory: Path, cfg: dict[str, Any]) -> set[str]:
    """The experts' 3-D parameters `target_parameters` names (`peft_experts`)."""
    names = cfg.get("target_parameters") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _fail(
            directory, f"{PEFT_CONFIG}: target_parameters is not a list of names", "E-ADAPTER-PEFT"
        )
    others = [n for n in names if n.rsplit(".", 1)[-1] not in peft_experts.PARAMETERS]
    if others:
        raise _fail(
            directory,
            f"target parameters {others} are not mixture-of-experts expert parameters",
            "E-ADAPTER-PEFT",
            f"supported: {', '.join(peft_experts.TARGET_PARAMETERS.values())}",
        )
    return {n.rsplit(".", 1)[-1] for n in names}


_PATTERN_KEY = re.compile(r"[\w.\\]*(\.\*[\w.\\]*){0,2}")
"""A rank or alpha pattern key Aner matches: names, dots and at most two `.*` (PEFT matches the
keys as regular expressions; these cannot backtrack badly)."""


def _plain_key(key: Any) -> bool:
    if not isinstance(key, str) or len(key) > 200 or not _PATTERN_KEY.fullmatch(key):
        return False
    try:
        re.compile(key)
    except re.error:
        return False
    return True


def _pattern(directory: Path, cfg: dict[str, Any], key: str) -> dict[str, float]:
    """PEFT's `rank_pattern` or `alpha_pattern` (key -> number)."""
    pattern = cfg.get(key) or {}
    if not isinstance(pattern, dict) or not all(
        _plain_key(k) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in pattern.items()
    ):
        raise _fail(
            directory,
            f"{PEFT_CONFIG}: {key} is not an object of plain names (dots and at most two .*) "
            "to numbers",
            "E-ADAPTER-PEFT",
        )
    return pattern


def _widths(
    directory: Path, adapter: Any, rank: int, alpha: float, patterns: dict[str, dict[str, float]]
) -> dict[str, int]:
    """How many rank-`rank` LoRAs each expert parameter's LoRA is (`peft_experts.unpack`).

    Aner's LoRA has one rank and one scaling: what `rank_pattern` and `alpha_pattern` give a
    target must keep `alpha / rank`, with the rank itself only doubled on `gate_up_proj`."""
    widths: dict[str, int] = {}
    for name, _ in adapter.targets:
        block, _, target = name.rpartition(".")
        parameter = peft_experts.parameter_of(target) if peft_experts.is_expert(name) else None
        theirs = f"model.{block.rpartition('.')[0]}.{parameter}" if parameter else f"model.{name}"
        r = peft_experts.pattern_value(patterns["rank_pattern"], theirs, rank)
        a = peft_experts.pattern_value(patterns["alpha_pattern"], theirs, alpha)
        width = int(r) // rank if int(r) == r else 0
        allowed = (1, 2) if parameter == peft_experts.GATE_UP else (1,)
        if width not in allowed or width * rank != r or a * rank != alpha * r:
            raise _fail(
                directory,
                f"rank_pattern and alpha_pattern give {theirs} rank {r} and alpha {a}; Aner's "
                f"LoRA has one rank and scaling (r {rank}, lora_alpha {alpha})",
                "E-ADAPTER-PEFT",
            )
        if parameter:
            widths[parameter] = width
    return widths


def load_adapter(model: Any, directory: str | Path) -> Any:
    """An adapter of `model` read from `directory` (Aner's format or PEFT's LoRA/DoRA)."""
    d = Path(directory)
    if (d / ANER_CONFIG).exists():  # not is_file: a device or a folder there is an error
        return _load_aner(model, d)
    if (d / PEFT_CONFIG).exists():
        return _load_peft(model, d)
    raise _fail(d, f"neither {ANER_CONFIG} nor {PEFT_CONFIG} is there", "E-ADAPTER-MISSING")


def save_adapter_builtin(
    ctx: Any, *, adapter: Any, dir: str, format: str = "peft", overwrite: bool = False
) -> str:
    """Builtin `save_adapter`: `dir` is relative to the script; returns the folder written (by
    rank 0 alone in a distributed run)."""
    folder = ctx.resolve_path(dir)
    return str(once(save_adapter, adapter, folder, format, overwrite=overwrite) or folder)


def load_adapter_builtin(ctx: Any, *, model: Any, dir: str) -> Any:
    """Builtin `load_adapter`: `dir` is relative to the script."""
    return load_adapter(model, ctx.resolve_path(dir))
