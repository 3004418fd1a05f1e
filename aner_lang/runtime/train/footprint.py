"""The counting rules of training memory, from sizes alone (no torch): one place for the bytes
of each category, shared by the memory report of a loaded run (`memory`) and the plan made from a
model's header before anything loads (`plan`).

Rules:

* AdamW keeps two fp32 moments per trainable scalar; paged AdamW keeps the moments of tensors of
  at least `PAGE_MIN_ELEMENTS` elements in CUDA managed memory, which the GPU sees through a
  prefetch window of `page_bytes`.
* A double-quantized NF4 weight stores a nibble per element, one byte of quantized absmax per
  block of 64, one fp32 scale per 256 blocks and one fp32 offset (`NF4Weight.packed_nbytes`).
* The NF4 dequantization buffer is the host-tiled kernel's tile, or, for the fused kernel, the
  largest weight (or row slice of a weight, `model.chunking.row_slices`) dequantized into the
  compute dtype (a buffer reused across layers).
* Activations (half precision, `keep`): per decoder layer and token, the tensors the step keeps
  for backward: each RMSNorm's input and its fp32 1/rms; the rotated queries and keys, the values,
  attention's output and its fp32 logsumexp per head; SwiGLU's gate and up; LoRA's `x @ A^T` per
  target. The normed inputs, o_proj's copy of attention's output and the SwiGLU product are
  recomputed in backward (`model.activations.recomputing`). `checkpoint` keeps each layer's input
  and one layer's worth during its recomputation; `offload` keeps only that one layer on the GPU
  (the layer inputs, attention's output and its log-sum-exp in pinned host memory).
  A checkpointed layer's MLP holds gate and up for one tile of tokens at a time
  (`model.chunking.mlp_tile_tokens`).
* Backward of one layer holds the gradients of what the layer kept, in fp32 (the fused NF4
  backward and the norm and SwiGLU backward compute in fp32): twice that layer's activations.
  Beside a checkpointed layer's recomputation it holds one layer's worth
  (`CHECKPOINTED_BACKWARD_FACTOR`): the recomputed tensors count in the activations already, and
  the measured peaks (benchmarks/results/h200_train_scale_checkpoint.json, contexts 2048 and
  8192) show the rest is one layer's worth, not two.
* The chunked loss (`model.loss.head_loss_sum`) holds about twice one chunk's fp32 logits
  (`model.chunking.CHUNK_BYTES` at most); with the fused CUDA loss kernel one chunk's 16-bit
  logits, which the kernel overwrites with their gradient (`model.loss.chunk_tokens`); a float32
  loss holds the logits, their log-softmax and their gradient, fp32.
* CUDA libraries keep workspaces that the caching allocator counts: cuBLAS one of
  `CUBLAS_WORKSPACE_BYTES` per stream it runs on (the training stream, the stream of the
  precision check, and the side stream a CUDA graph's recording warms up on). Measured with the
  allocator's history on the H200 (benchmarks/results/h200_plan_check.md): each is 32 MiB, and
  each `train` call leaves one more behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

FP32_MOMENTS = 2 * 4
"""Bytes of AdamW state per trainable scalar (two fp32 moments)."""
PAGE_MIN_ELEMENTS = 100_000
"""Paged AdamW keeps the moments of tensors at least this large in managed memory."""
NF4_BLOCK = 64
NF4_BLOCKS_PER_SCALE = 256
LOSS_WORKSPACE_CHUNKS = 2
"""The chunked loss's transient memory, in chunks of fp32 logits."""
BACKWARD_FACTOR = 2
"""One layer's backward holds this many times its activations (fp32 gradients of bf16 tensors)."""
CHECKPOINTED_BACKWARD_FACTOR = 1
"""The same beside a checkpointed (or offloaded) layer's recomputation, as measured."""
CUBLAS_WORKSPACE_BYTES = 32 << 20
"""cuBLAS's workspace per stream on Hopper (PyTorch's default `CUBLAS_WORKSPACE_CONFIG`)."""
EAGER_FROM_TOKENS = 8192
"""Micro-batches of this many tokens or more run eagerly. Reason: there the GPU, not the host, is
the bound, and replaying gains nothing while the recording's memory pool adds to the peak. On the
H200, full Llama-3-8B shape, checkpointed, 8192 tokens: eager 9,518 tok/s in 9.0 GB against
9,198 replayed in 9.4 GB; at 2048 tokens replaying is 2.2x the eager step
(benchmarks/results/h200_scale.md)."""
RESIDUAL_COPIES = 4
"""`[tokens, hidden]` tensors outside the layers: the embedding's rows, the final norm's input and
output, and the gradient to the hidden states the loss keeps."""


def activation_bytes(precision: str) -> int:
    """Bytes of one activation element under `precision`: 16-bit but in float32."""
    return 4 if precision == "float32" else 2


OFFLOAD_KEEPS = ("attention", "qkv", "o_proj")
"""What a checkpointed layer under `offload` can keep in pinned host memory besides its input,
named as its `kept_through_backward` calls name them, in the order a run gives them up when the
host cannot hold them all (`offload_keeps`): attention's output and log-sum-exp (which spare its
forward), the rotated queries, keys and values (the q/k/v projections), o_proj's output. Each
needs the ones before it: a kept call's inputs are filled by the recomputation."""


def offload_copy_bytes(
    tokens: int, shape: LayerShape, act_bytes: int, keeps: tuple[str, ...] = OFFLOAD_KEEPS
) -> list[int]:
    """The bytes of each copy `offload` keeps in pinned host memory per decoder layer, in the order
    the forward makes them: the layer's `[tokens, hidden]` input, then of `keeps` its rotated
    queries, keys and values (`qkv`), its attention's `[tokens, q_size]` output and fp32
    log-sum-exp per head and token (`attention`), and o_proj's `[tokens, hidden]` output
    (`o_proj`) (`model.activations.kept_through_backward`). Left out: the LoRA's kept low-rank
    products (rank x targets per token, under 0.5% of the rest at rank 16)."""
    s, b = shape, act_bytes
    copies = [tokens * s.hidden * b]
    if "qkv" in keeps:
        copies += [tokens * width * b for width in (s.q_size, s.kv_size, s.kv_size)]
    if "attention" in keeps:
        copies += [tokens * s.q_size * b, tokens * s.heads * 4]
    if "o_proj" in keeps:
        copies.append(tokens * s.hidden * b)
    return copies


def offload_host_bytes(
    layers: int,
    tokens: int,
    shape: LayerShape,
    act_bytes: int,
    keeps: tuple[str, ...] = OFFLOAD_KEEPS,
) -> int:
    """Pinned host memory `offload` keeps with `keeps` kept besides the layer inputs: every
    decoder layer's copies (`offload_copy_bytes`), each pinned at exactly its bytes
    (`model.pinned_blocks`)."""
    return layers * sum(offload_copy_bytes(tokens, shape, act_bytes, keeps))


def offload_keeps(
    layers: int, tokens: int, shape: LayerShape, act_bytes: int, host: int | None
) -> tuple[str, ...]:
    """What `offload` keeps besides the layer inputs on a host with `host` bytes available: the
    longest prefix of `OFFLOAD_KEEPS` whose pinned copies fit (all of it where `host` is not
    known; none where not even the inputs fit, which `budget.host_fit` warns of). Each dropped
    call runs again in the recomputation, as under `checkpoint`: slower, never refused."""
    for n in range(len(OFFLOAD_KEEPS), 0, -1):
        keeps = OFFLOAD_KEEPS[:n]
        if host is None or offload_host_bytes(layers, tokens, shape, act_bytes, keeps) <= host:
            return keeps
    return ()


def workspace_bytes(graphs: bool) -> int:
    """The cuBLAS workspaces of one `train` call on CUDA: the training stream's, the precision
    check's and, with CUDA graphs, the recording's side stream's."""
    return CUBLAS_WORKSPACE_BYTES * (3 if graphs else 2)


def optimizer_bytes(trainable_numel: int) -> int:
    """AdamW moments for `trainable_numel` trainable scalars."""
    return FP32_MOMENTS * trainable_numel


def managed_optimizer_bytes(numels: Iterable[int], paged: bool) -> int:
    """The part of the moments paged AdamW keeps in managed memory (0 when not paged)."""
    return sum(FP32_MOMENTS * n for n in numels if n >= PAGE_MIN_ELEMENTS) if paged else 0


def dequant_tile_bytes(packed_bytes: int, fused: bool, tile_bytes: int) -> int:
    """The host-tiled kernel's tile when the base is packed and the kernel is not fused."""
    return 0 if fused or not packed_bytes else tile_bytes


def nf4_bytes(numel: int) -> int:
    """Bytes of one double-quantized NF4 weight of `numel` elements."""
    blocks = -(-numel // NF4_BLOCK)
    return -(-numel // 2) + blocks + 4 * -(-blocks // NF4_BLOCKS_PER_SCALE) + 4


@dataclass(frozen=True)
class LayerShape:
    """What one decoder layer's activations depend on."""

    hidden: int
    q_size: int
    kv_size: int
    intermediate: int
    heads: int


def layer_shape(config: Any) -> LayerShape:
    """A dense decoder layer's shape in a model config (`model.config.ModelConfig`)."""
    c = config
    return LayerShape(
        c.hidden_size, c.q_size, c.kv_size, c.intermediate_size, c.num_attention_heads
    )


def layer_activation_bytes(
    shape: LayerShape, tokens: int, act_bytes: int, adapter_rows: int, mlp_tokens: int = 0
) -> int:
    """Bytes one decoder layer keeps for backward over `tokens` tokens in half precision.

    `adapter_rows` is the per-token width the adapters keep beside their inputs (LoRA: the rank
    once per target); `mlp_tokens`, where less than `tokens`, the tokens of the MLP's tile."""
    s = shape
    half = (
        2 * s.hidden  # the two RMSNorm inputs (their normed outputs are recomputed in backward)
        + s.q_size  # rotated queries
        + 2 * s.kv_size  # rotated keys, values
        + s.q_size  # attention's output (o_proj's merged copy of it is recomputed in backward)
        + adapter_rows
    )
    fp32 = 2 + s.heads  # 1/rms of each norm, logsumexp per head
    mlp = 2 * s.intermediate  # gate and up (their SwiGLU product is recomputed in backward)
    mlp_tokens = min(mlp_tokens or tokens, tokens)
    return tokens * (act_bytes * half + 4 * fp32) + mlp_tokens * act_bytes * mlp
