"""Mixture-of-experts LoRA in PEFT's form: one `target_parameters` LoRA per 3-D expert parameter.

transformers (5) keeps a sparse layer's experts as two 3-D parameters of
`model.layers.{i}.mlp.experts`, the same for Mixtral and Qwen3-MoE: `gate_up_proj`
`[experts, 2 * intermediate, hidden]` (each expert's gate rows, then its up rows: the forward
chunks the output in two) and `down_proj` `[experts, hidden, intermediate]`. PEFT adapts such a
parameter with `LoraConfig(target_parameters=["experts.gate_up_proj", ...])` (`ParamWrapper`):
every expert `e` has its own rank-r factors, stored as `lora_A.weight` `[r * experts, in]` with
expert e's rows at `e*r .. e*r + r` and `lora_B.weight` `[out, r * experts]` with expert e's rank
column k at `k * experts + e` (PEFT reshapes B to `[out, r, experts]`), and the delta
`scaling * B_e @ A_e` added to the expert's `[out, in]` slice.

Aner's per-expert LoRAs map onto this exactly. `down_proj` is one to one. Separate gate and up
LoRAs of rank r are one rank-2r LoRA of `gate_up_proj` with `A_e = [A_gate; A_up]` and a
block-diagonal `B_e = diag(B_gate, B_up)`, scaled by `2 * alpha / (2r)` through `rank_pattern`
and `alpha_pattern`; one of them alone is a rank-r LoRA whose B is zero on the other half.
Reading goes back the same way: a rank-2r `gate_up_proj` LoRA splits into gate and up only when
its B is block-diagonal, a rank-r one gives gate and up the same A.

When both parameters of a layer are adapted PEFT nests the wrappers in the module's parameter
order: `gate_up_proj`'s LoRA is the inner one (`experts.base_layer.lora_A.weight`), `down_proj`'s
the outer (`experts.lora_A.weight`); one adapted parameter alone is `experts.lora_A.weight`.
PEFT's `ParamWrapper` refuses LoRA dropout and DoRA, so those adapters have no such form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

GATE_UP, DOWN = "gate_up_proj", "down_proj"
PARAMETERS = (GATE_UP, DOWN)
"""The experts' 3-D parameters in the module's order (which is PEFT's nesting order)."""
TARGET_PARAMETERS = {p: f"experts.{p}" for p in PARAMETERS}
"""What `LoraConfig.target_parameters` lists for each."""
_HALVES = ("gate_proj", "up_proj")
"""Aner's targets fused into `gate_up_proj`, in its row order."""
_OURS = re.compile(
    r"^(?P<block>layers\.\d+\.mlp\.experts)\.(?P<e>\d+)\."
    r"(?P<target>gate_proj|up_proj|down_proj)\.(?P<kind>lora_A|lora_B)$"
)
_THEIRS = re.compile(
    r"^(?P<block>layers\.\d+\.mlp\.experts)\.(?P<inner>base_layer\.)?(?P<kind>lora_A|lora_B)\.weight$"
)


def is_expert(name: str) -> bool:
    """Whether our tensor or module name `name` belongs to an expert."""
    return ".experts." in name


def parameter_of(target: str) -> str:
    """The 3-D parameter holding Aner's expert target `target`."""
    return DOWN if target == DOWN else GATE_UP


@dataclass
class Packed:
    """PEFT's expert tensors (names without PEFT's prefix) and the LoraConfig fields they need."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    target_parameters: list[str] = field(default_factory=list)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)


def _key(block: str, parameter: str, adapted: set[str], kind: str) -> str:
    inner = parameter == GATE_UP and DOWN in adapted
    return f"{block}.{'base_layer.' if inner else ''}{kind}.weight"


def _stack(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's (lora_A, lora_B) of the experts' factors `a[e]` `[r, in]`, `b[e]` `[out, r]`."""
    return torch.cat(a).contiguous(), torch.stack(b, dim=-1).flatten(1).contiguous()


def pack(ours: dict[str, torch.Tensor], rank: int, alpha: float) -> Packed:
    """PEFT's form of the expert tensors among `ours` (``layers.{i}.mlp.experts.{e}.{target}
    .lora_A``/``lora_B``, every expert of a layer present) of a rank-`rank` LoRA."""
    by_block: dict[str, dict[str, dict[int, dict[str, torch.Tensor]]]] = {}
    for name, t in ours.items():
        m = _OURS.match(name)
        if m is None:
            continue
        targets = by_block.setdefault(m["block"], {})
        targets.setdefault(m["target"], {}).setdefault(int(m["e"]), {})[m["kind"]] = t.float()
    out = Packed()
    fused = 0
    for block, targets in by_block.items():
        adapted = {parameter_of(t) for t in targets}
        experts = range(len(next(iter(targets.values()))))
        if DOWN in targets:
            down = targets[DOWN]
            a, b = _stack(
                [down[e]["lora_A"] for e in experts], [down[e]["lora_B"] for e in experts]
            )
            out.tensors[_key(block, DOWN, adapted, "lora_A")] = a
            out.tensors[_key(block, DOWN, adapted, "lora_B")] = b
        halves = [targets.get(h) for h in _HALVES]
        present = [h for h in halves if h is not None]
        if present:
            fused = len(present)
            a_list, b_list = [], []
            for e in experts:
                a_list.append(torch.cat([h[e]["lora_A"] for h in present]))
                rows = present[0][e]["lora_B"].shape[0]
                b_list.append(
                    torch.block_diag(
                        *(h[e]["lora_B"] if h is not None else torch.zeros(rows, 0) for h in halves)
                    )
                )
            a, b = _stack(a_list, b_list)
            out.tensors[_key(block, GATE_UP, adapted, "lora_A")] = a
            out.tensors[_key(block, GATE_UP, adapted, "lora_B")] = b
        for p in sorted(adapted, key=PARAMETERS.index):
            if TARGET_PARAMETERS[p] not in out.target_parameters:
                out.target_parameters.append(TARGET_PARAMETERS[p])
    if fused == 2:
        out.rank_pattern[TARGET_PARAMETERS[GATE_UP]] = 2 * rank
        out.alpha_pattern[TARGET_PARAMETERS[GATE_UP]] = 2 * alpha
    return out


class NotOurs(ValueError):
    """PEFT expert tensors that are not per-expert LoRAs of one rank (the message says why)."""


def _split(
    a: torch.Tensor, b: torch.Tensor, rank: int, name: str
) -> list[tuple[torch.Tensor, ...]]:
    """Per expert `(A_e [rank, in], B_e [out, rank])` of PEFT's stacked `a`, `b`."""
    experts, rest = divmod(a.shape[0], rank) if a.dim() == 2 else (0, 1)
    if rest or not experts or b.dim() != 2 or b.shape[1] != a.shape[0]:
        raise NotOurs(
            f"{name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not rank-{rank} "
            "factors of one number of experts"
        )
    a3 = a.reshape(experts, rank, a.shape[1])
    b3 = b.reshape(b.shape[0], rank, experts).permute(2, 0, 1)
    return [(a3[e].contiguous(), b3[e].contiguous()) for e in range(experts)]


def unpack(
    theirs: dict[str, torch.Tensor], adapted: set[str], rank: int, widths: dict[str, int]
) -> dict[str, torch.Tensor]:
    """Our per-expert tensors of PEFT's expert tensors `theirs` (names without PEFT's prefix,
    ``layers.{i}.mlp.experts[.base_layer].lora_A.weight``) of the `adapted` parameters, each a
    LoRA of rank `rank * widths[p]`: a width-2 `gate_up_proj` must be block-diagonal (a gate and
    an up LoRA of rank `rank`), a width-1 one gives gate and up the same A."""
    pairs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, t in theirs.items():
        m = _THEIRS.match(name)
        if m is None:
            raise NotOurs(f"unexpected tensor {name!r}")
        p = GATE_UP if m["inner"] or adapted == {GATE_UP} else DOWN
        if m["inner"] and adapted != set(PARAMETERS):
            raise NotOurs(f"unexpected tensor {name!r}")
        pairs.setdefault((m["block"], p), {})[m["kind"]] = t.float()
    out: dict[str, torch.Tensor] = {}
    for (block, p), kinds in pairs.items():
        if set(kinds) != {"lora_A", "lora_B"}:
            raise NotOurs(f"{block}.{p} has no lora_A and lora_B pair")
        width = widths[p]
        for e, (a, b) in enumerate(_split(kinds["lora_A"], kinds["lora_B"], rank * width, p)):
            if p == DOWN:
                out[f"{block}.{e}.{DOWN}.lora_A"], out[f"{block}.{e}.{DOWN}.lora_B"] = a, b
                continue
            rows = b.shape[0] // 2
            for half, target in enumerate(_HALVES):
                cols = slice(half * rank, (half + 1) * rank) if width == 2 else slice(None)
                b_half = b[half * rows : (half + 1) * rows]
                if width == 2 and b_half[:, (1 - half) * rank : (2 - half) * rank].any():
                    raise NotOurs(
                        f"{block}.{p}: expert {e}'s rank-{2 * rank} LoRA is not a gate and an up "
                        f"LoRA of rank {rank} (its lora_B is not block-diagonal)"
                    )
                out[f"{block}.{e}.{target}.lora_A"] = a[cols].contiguous()
                out[f"{block}.{e}.{target}.lora_B"] = b_half[:, cols].contiguous()
    return out


def targets_of(parameter: str) -> tuple[str, ...]:
    """Aner's targets held in the expert parameter `parameter`."""
    return _HALVES if parameter == GATE_UP else (DOWN,)


def is_packed(name: str) -> bool:
    """Whether PEFT's tensor `name` (without its prefix) is a stacked expert LoRA factor."""
    return _THEIRS.match(name) is not None


def pattern_value(pattern: dict[str, float], name: str, default: float) -> float:
    """The value PEFT's `rank_pattern`/`alpha_pattern` gives the module or parameter `name`
    (PEFT's rule: the first key `k` with `name` matching `(.*\\.)?(k)$`), else `default`."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default
