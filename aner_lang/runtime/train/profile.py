"""Training profiles: precision, optimizer, NF4 kernel, paging and loss scaling, validated early.

A `Profile` is what `profile(...)` returns in a script. Its static rules (ranges, enum members)
are registry constraints the checker applies to literals; `Profile.validate(model)` applies the
rules that need the machine or the model (fused without CUDA, float16 where autocast cannot run,
managed memory budget) before the first batch, so a bad profile never costs a training run.
The kernel a profile means on a device is `nf4.backends.resolve_kernel`'s one rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from aner_lang.builtins import members
from aner_lang.host.units import human_bytes
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.precision import DTYPES
from aner_lang.runtime.nf4.backends import (
    KERNELS,
    HostTiled,
    NF4Backend,
    get_backend,
    resolve_kernel,
)
from aner_lang.runtime.train.loss_scale import LossScaleState

PRECISIONS = members("Precision")
ACTIVATIONS = members("Activations")
OPTIMIZERS = members("Optimizer")


def check_precision_supported(precision: str, device: torch.device) -> None:
    """Reject a precision this device cannot run, before any training starts."""
    if precision == "float32":
        return
    dtype = DTYPES[precision]
    if not torch.amp.is_autocast_available(device.type):
        raise AnerRuntimeError(
            f"precision: {precision} needs autocast, which {device.type} lacks",
            code="E-PRECISION",
            notes=("use precision: float32",),
        )
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise AnerRuntimeError(
            "precision: bfloat16 is not supported by this GPU",
            code="E-PRECISION",
            notes=("use precision: float16 or float32",),
        )
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        (a @ a).sum().item()
    except RuntimeError as exc:
        raise AnerRuntimeError(
            f"precision: {precision} matmul is not supported on {device.type}: {exc}",
            code="E-PRECISION",
            notes=("use precision: float32",),
        ) from None


def dynamic(
    initial: float = 65536.0,
    growth_interval: int = 2000,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    max_retries: int = 3,
) -> LossScaleState:
    """A dynamic loss scale with GradScaler's defaults (builtin `dynamic`)."""
    return LossScaleState(
        "dynamic",
        scale=float(initial),
        growth_interval=growth_interval,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        max_retries=max_retries,
    )


def fixed(scale: float) -> LossScaleState:
    """A constant loss scale (builtin `fixed`); an overflow still skips the update."""
    return LossScaleState("fixed", scale=float(scale))


@dataclass
class Profile:
    """How an update runs. Masters and optimizer moments are always fp32."""

    precision: str = "float32"
    optimizer: str = "adamw"
    kernel: str = "auto"
    page_bytes: int = 2 << 20
    loss_scale: LossScaleState | None = None
    memory_budget: int | None = None
    dequant_tile_bytes: int = 8 << 20
    """host_tiled NF4: bytes of one dequantized weight tile (memory report hook)."""
    activations: str = "keep"
    """What an update keeps for backward (`model.activations`)."""
    graphs: bool = True
    """Record each batch shape's forward and backward as a CUDA graph where it can run
    (`train.graphs`)."""

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("precision", self.precision, PRECISIONS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("kernel", self.kernel, KERNELS),
            ("activations", self.activations, ACTIVATIONS),
        ):
            if value not in allowed:
                raise AnerRuntimeError(
                    f"profile: unknown {name} {value!r}; expected one of {', '.join(allowed)}",
                    code="E-PROFILE",
                )
        if self.page_bytes < 4096:
            raise AnerRuntimeError(
                f"profile: page_bytes must be at least 4 KiB, got {self.page_bytes}",
                code="E-PROFILE",
            )
        if self.loss_scale is None:  # fp16 needs scaling; fp32 and bf16 do not (GradScaler use)
            self.loss_scale = dynamic() if self.precision == "float16" else LossScaleState("none")

    @property
    def scale_state(self) -> LossScaleState:
        """The loss-scale rule (set in `__post_init__`: none given means dynamic() for float16
        and no scaling otherwise)."""
        if self.loss_scale is None:
            raise AssertionError("Profile.__post_init__ sets loss_scale")
        return self.loss_scale

    def resolved_kernel(self, device: torch.device) -> str:
        """The NF4 kernel this profile runs on `device` (`backends.resolve_kernel`'s rule)."""
        return resolve_kernel(self.kernel, device)

    def backend(self, device: torch.device) -> NF4Backend:
        """The NF4 backend a run with this profile enters (`backends.using_backend`)."""
        kernel = self.resolved_kernel(device)
        return HostTiled(self.dequant_tile_bytes) if kernel == "host_tiled" else get_backend(kernel)

    def validate(self, device: torch.device) -> None:
        """Rules that need the machine: raise a clear error before training starts."""
        self.resolved_kernel(device)
        check_precision_supported(self.precision, device)
        if self.memory_budget is not None and device.type == "cuda":
            # The budget is the run's whole peak, the model this process has loaded included:
            # what the GPU can give it is what is free plus what torch already holds here.
            free, _ = torch.cuda.mem_get_info(device)
            held = torch.cuda.memory_reserved(device)
            if self.memory_budget > free + held:
                raise AnerRuntimeError(
                    f"profile: memory_budget {human_bytes(self.memory_budget)} "
                    f"({self.memory_budget} bytes) is more than the GPU can give this run: "
                    f"{human_bytes(free)} free and {human_bytes(held)} this process holds",
                    code="E-PROFILE-BUDGET",
                )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Profile:
        data = dict(data)
        ls = data.pop("loss_scale", None)
        return cls(loss_scale=LossScaleState(**ls) if ls else None, **data)

    def __repr__(self) -> str:
        ls = self.loss_scale
        scale = "none" if ls is None or ls.kind == "none" else f"{ls.kind}({ls.scale:g})"
        return (
            f"Profile({self.precision}, {self.optimizer}, kernel {self.kernel}, "
            f"page {self.page_bytes} B, loss scale {scale})"
        )


def profile(
    precision: str = "float32",
    optimizer: str = "adamw",
    kernel: str = "auto",
    page_bytes: int = 2 << 20,
    loss_scale: LossScaleState | None = None,
    memory_budget: int | None = None,
    activations: str = "keep",
    graphs: bool = True,
) -> Profile:
    """Builtin `profile`: construct and check what can be checked without a model."""
    p = Profile(
        precision,
        optimizer,
        kernel,
        page_bytes,
        loss_scale,
        memory_budget,
        activations=activations,
        graphs=graphs,
    )
    if kernel == "fused":  # fails here, before any model loads, where no GPU can run it
        resolve_kernel(kernel, torch.device("cuda"))
    return p
