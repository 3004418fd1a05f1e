"""The Llama decoder in torch, with HF module names so adapters and exports map one to one.

Matches HF transformers' `LlamaForCausalLM` numerically (RMSNorm in fp32, split-half RoPE computed
in fp32, GQA attention through `scaled_dot_product_attention`, SwiGLU). Every weight matrix is a
`FrozenLinear` called as a module, so NF4 can swap it and adapters can wrap it.

Precision: the residual stream is kept in the compute dtype, fp32 unless an autocast region
(a half-precision profile) is active, where it is that half dtype, as the models' own bf16
checkpoints run. What buys accuracy stays fp32 in every case: the norm statistics, the rotary
angles, the loss (`loss`), and the trainable masters (owned by adapters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.activations import (
    kept_through_backward,
    last_saves,
    recomputing,
    run_layer,
    run_tiled,
)
from aner_lang.runtime.model.chunking import mlp_tile_tokens
from aner_lang.runtime.model.config import ModelConfig
from aner_lang.runtime.model.fused_ops import rms_norm, rope, swiglu
from aner_lang.runtime.model.linear import FrozenLinear, outputs_of
from aner_lang.runtime.model.loss import IGNORE, head_loss_sum, logits_loss_sum
from aner_lang.runtime.model.moe import collecting_router_logits, load_balancing_loss
from aner_lang.runtime.model.packing import Segments, packed_attention
from aner_lang.runtime.model.precision import compute_dtype
from aner_lang.runtime.model.sections import section


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 (as HF does), weight kept fp32 and frozen."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(torch.float32), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with section("norms_activations"):
            if x.dtype != torch.float32:  # half precision: keep only x for backward
                return rms_norm(x, self.weight, self.eps)
            dtype = x.dtype
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (self.weight * h.to(dtype)).to(dtype)


class KVCache:
    """Keys and values of past positions, per layer, for incremental decoding.

    Storage grows by concatenation; `length` is the number of cached positions, which is also the
    position of the next token fed to the model.
    """

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's `[B, H_kv, T, D]` keys/values for `layer`; return all of them."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k = torch.cat([old_k, k], dim=2)
            v = torch.cat([old_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class RotaryEmbedding(nn.Module):
    """HF-style split-half rotary position embedding (cos/sin computed in fp32) over the first
    `config.rotary_dim` dimensions of a head.

    LongRoPE (`RopeScaling` ``longrope``) divides each frequency by its own factor and scales
    cos/sin by the attention factor. As in transformers, one forward uses the long factors for
    every position when its longest sequence (the largest position + 1) exceeds the pretraining
    context, the short ones otherwise; keys already cached keep the angles they were computed
    with. (llama.cpp instead chooses once, by the context size it was started with.)"""

    def __init__(self, config: ModelConfig, freq_factors: torch.Tensor | None = None) -> None:
        super().__init__()
        d = config.rotary_dim
        powers = config.rope_theta ** (
            torch.arange(0, d, 2, dtype=torch.int64).to(torch.float32) / d
        )
        inv_freq = 1.0 / powers
        if freq_factors is not None:  # Llama 3 rope scaling, stored by llama.cpp as rope_freqs
            inv_freq = inv_freq / freq_factors.to(torch.float32)
        s = config.rope_scaling
        self.longrope = s if s is not None and s.rope_type == "longrope" else None
        self.scale = 1.0
        if self.longrope is not None:  # transformers' arithmetic: 1 / (factor * theta^(2i/d))
            self.scale = self.longrope.attention_factor
            inv_freq = 1.0 / (torch.tensor(self.longrope.short_factor) * powers)
            long = 1.0 / (torch.tensor(self.longrope.long_factor) * powers)
            self.register_buffer("long_inv_freq", long, persistent=False)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(
        self, positions: torch.Tensor, length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Angles `[T, D]` of positions `[T]`, or `[B, 1, T, D]` of per-row positions `[B, T]`.
        `length`: the longest sequence these positions belong to (default: the largest + 1),
        which chooses LongRoPE's factors."""
        inv_freq = self.get_buffer("inv_freq")
        if self.longrope is not None:
            longest = int(positions.max()) + 1 if length is None else length
            if longest > self.longrope.original_max_position_embeddings:
                inv_freq = self.get_buffer("long_inv_freq")
        freqs = positions.to(torch.float32)[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        if positions.dim() == 2:
            emb = emb[:, None]
        if self.scale != 1.0:
            return emb.cos() * self.scale, emb.sin() * self.scale
        return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `[B, H, T, D]` queries or keys by the position angles (`[T, D]`, or `[B, 1, T, D]`
    for per-row positions)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def window_mask(
    t: int,
    past: int,
    window: int | None,
    device: torch.device,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """`[t, past + t]` (or `mask`'s shape): query i (absolute position past+i) sees key j when
    j <= past+i and, with a `window`, past+i - j < window; and where `mask` allows it."""
    keys = torch.arange(past + t, device=device)[None, :]
    queries = (past + torch.arange(t, device=device))[:, None]
    band = keys <= queries
    if window is not None:
        band = band & (keys > queries - window)
    return band if mask is None else mask & band


class LlamaAttention(nn.Module):
    """Grouped-query self-attention over `q_proj`, `k_proj`, `v_proj`, `o_proj`.

    Architecture options (their tables in `aner_lang.architectures` say which model has which):
    `q_bias`/`k_bias`/`v_bias` are added to the projections' outputs (Qwen2), after any adapter's
    delta, as HF adds a Linear's bias; `q_norm`/`k_norm` RMS-normalise every head of the queries
    and keys before rope (Qwen3, Gemma 3). `scale` replaces the softmax scale 1/sqrt(head size)
    (Gemma's 1/sqrt(query_pre_attn_scalar)); `window` limits each query to the last `window`
    positions, its own included (Gemma's sliding layers); `softcap` turns every scaled score s
    into softcap * tanh(s / softcap) before the mask and softmax (Gemma 2), which the fused
    `scaled_dot_product_attention` cannot do, so those models attend eagerly (`softcapped`).
    """

    def __init__(
        self,
        config: ModelConfig,
        q_proj: FrozenLinear,
        k_proj: FrozenLinear,
        v_proj: FrozenLinear,
        o_proj: FrozenLinear,
        q_bias: torch.Tensor | None = None,
        k_bias: torch.Tensor | None = None,
        v_bias: torch.Tensor | None = None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        scale: float | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.scale, self.window, self.softcap = scale, window, softcap
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        for name, bias in (("q_bias", q_bias), ("k_bias", k_bias), ("v_bias", v_bias)):
            frozen = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
            self.register_parameter(name, frozen)
        self.q_norm, self.k_norm = q_norm, k_norm
        self.q_bias: torch.Tensor | None
        self.k_bias: torch.Tensor | None
        self.v_bias: torch.Tensor | None

    def _heads(self, y: torch.Tensor, bias: torch.Tensor | None, heads: int) -> torch.Tensor:
        """A projection's `[B, T, heads * head_dim]` output with its bias, as
        `[B, T, heads, head_dim]`."""
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.view(*y.shape[:2], heads, self.head_dim)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values `[B, T, heads, head_dim]` of `[B, T, hidden]` inputs."""
        q, k, v = outputs_of(x, (self.q_proj, self.k_proj, self.v_proj))
        return (
            self._heads(q, self.q_bias, self.num_heads),
            self._heads(k, self.k_bias, self.num_kv_heads),
            self._heads(v, self.v_bias, self.num_kv_heads),
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer: int,
        cache: KVCache | None,
        mask: torch.Tensor | Segments | None = None,
    ) -> torch.Tensor:
        q, k, v = kept_through_backward(
            "qkv", lambda: self._rotated(x, cos, sin), (x, cos, sin), outputs=True
        )
        with section("attention"):
            heads = self._attend(q, k, v, layer, cache, mask)
        out = self._merge(heads)
        with recomputing(out, lambda: self._merge(heads)):  # an adapter on o_proj would keep
            return kept_through_backward(  # this copy; attention keeps `heads` anyway
                "o_proj", lambda: outputs_of(out, (self.o_proj,))[0], (out,), outputs=True
            )

    def _rotated(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries and keys of `[B, T, hidden]` inputs, normed where the model norms them and
        rotated, and their values, each `[B, heads, T, head_dim]`."""
        q, k, v = self._qkv(x)
        with section("attention"):
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = _rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q, k, v.transpose(1, 2)

    def _merge(self, heads: torch.Tensor) -> torch.Tensor:
        """`[B, heads, T, head_dim]` -> `[B, T, heads * head_dim]` (a copy unless T or heads is 1)."""
        b, _, t, _ = heads.shape
        return heads.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        cache: KVCache | None,
        mask: torch.Tensor | Segments | None,
    ) -> torch.Tensor:
        """The cache, then causal attention over rotated `[B, heads, T, head_dim]` inputs:
        `[B, heads, T, head_dim]`. Packed rows (no cache) give `mask` (`[B, 1, T, T]`, True where
        a query may see a key), which replaces the causal rule, or their `Segments`, each then
        attended alone (`packing`)."""
        if isinstance(mask, Segments):
            return mask.attend(q, k, v, lambda q, k, v: self._scores(q, k, v, None, 0))
        if cache is not None:
            past = cache.length
            k, v = cache.update(layer, k, v)
            return self._scores(q, k, v, mask, past)
        shared = (q, k, v) if mask is None else (q, k, v, mask)
        return kept_through_backward("attention", lambda: self._scores(q, k, v, mask, 0), shared)

    def _scores(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        past: int,
    ) -> torch.Tensor:
        """Attention of rotated `[B, heads, T, head_dim]` queries over keys and values that
        follow `past` cached positions: causal, or as `mask` says, within the window, soft-capped
        where the model caps."""
        t = q.shape[2]
        if self.window is not None and past + t > self.window:
            mask = window_mask(t, past, self.window, q.device, mask)
        groups = self.num_heads // self.num_kv_heads
        if self.softcap is not None:
            if mask is None:
                mask = window_mask(t, past, None, q.device)
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
            return softcapped(q, k, v, mask, self.softcap, self.scale)
        # fp32 keeps the reference arithmetic (its key/value gradients differ in the last bits);
        # half precision lets attention share each key/value head instead of copying it.
        shared = groups > 1 and q.dtype != torch.float32
        if groups > 1 and not shared:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scale = self.scale
        if mask is not None:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=shared, scale=scale
            )
        elif past == 0 or t == 1:  # causal from scratch, or one new token that sees every key
            causal = past == 0 and t > 1
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=shared, scale=scale
            )
        else:  # query i (absolute position past+i) sees keys 0..past+i
            mask = window_mask(t, past, None, q.device)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=shared, scale=scale
            )
        return out


def softcapped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    scale: float | None,
) -> torch.Tensor:
    """Attention over `[B, heads, T, head_dim]` queries and `[B, heads, S, head_dim]` keys and
    values whose scaled scores are soft-capped (cap * tanh(score / cap)) before `mask` (True where
    a query sees a key, `[T, S]` or `[B, 1, T, S]`) and the softmax, which runs in fp32, as
    transformers' eager Gemma 2 attention computes it."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (
        q.shape[-1] ** -0.5 if scale is None else scale
    )
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def _rotate(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys rotated over their first `cos.shape[-1]` dimensions (all of them, or
    a partial rotary fraction), the rest passed through, as transformers does."""
    d = cos.shape[-1]
    if d == q.shape[-1]:
        return rope(q, k, cos, sin) or (apply_rope(q, cos, sin), apply_rope(k, cos, sin))
    qr, kr = _rotate(q[..., :d], k[..., :d], cos, sin)
    return torch.cat([qr, q[..., d:]], dim=-1), torch.cat([kr, k[..., d:]], dim=-1)


class FusedQKVAttention(LlamaAttention):
    """Attention over one stored q/k/v matrix (`qkv_proj`, Phi-3): its output rows are the
    queries, then the keys, then the values; everything after the projection (`_qkv`) is the
    Llama attention's."""

    def __init__(self, config: ModelConfig, qkv_proj: FrozenLinear, o_proj: FrozenLinear) -> None:
        nn.Module.__init__(self)
        self.scale, self.window, self.softcap = None, None, None
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_proj, self.o_proj = qkv_proj, o_proj
        self.sizes = (config.q_size, config.kv_size, config.kv_size)
        self.q_norm = self.k_norm = None
        self.q_bias = self.k_bias = self.v_bias = None

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = outputs_of(x, (self.qkv_proj,))[0].split(self.sizes, dim=-1)
        shape = (*x.shape[:2], -1, self.head_dim)
        return q.view(shape), k.view(shape), v.view(shape)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(
        self, gate_proj: FrozenLinear, up_proj: FrozenLinear, down_proj: FrozenLinear
    ) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    @property
    def intermediate(self) -> int:
        """The width of the gate, the up projection and their product."""
        return self.gate_proj.out_features

    def _gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = outputs_of(x, (self.gate_proj, self.up_proj))
        return gate, up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP of `x`, a tile of tokens at a time where a checkpointed micro-batch is long
        (`activations.run_tiled`)."""
        size = compute_dtype(x).itemsize
        return run_tiled(self._forward, x, mlp_tile_tokens(self.intermediate, size))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate_up(x)
        with section("norms_activations"):
            h = self.activation(gate, up)
        # an adapter on down_proj would keep h (gate and up are kept anyway); down_proj's
        # product leads to the layer's output, which no recomputation needs (`last_saves`)
        with recomputing(h, lambda: self.activation(gate, up)), last_saves():
            return outputs_of(h, (self.down_proj,))[0]

    @staticmethod
    def activation(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up (a Triton kernel on CUDA in half precision)."""
        return F.silu(gate) * up if gate.dtype == torch.float32 else swiglu(gate, up)


class GemmaMLP(LlamaMLP):
    """GeGLU feed-forward: down(gelu_tanh(gate(x)) * up(x)) (HF's ``gelu_pytorch_tanh``)."""

    @staticmethod
    def activation(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up


class FusedGateUpMLP(LlamaMLP):
    """SwiGLU over one stored gate/up matrix (`gate_up_proj`, Phi-3): the first half of its
    output rows is the gate, the second the up projection."""

    def __init__(self, gate_up_proj: FrozenLinear, down_proj: FrozenLinear) -> None:
        nn.Module.__init__(self)
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj

    @property
    def intermediate(self) -> int:
        return self.gate_up_proj.out_features // 2

    def _gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = outputs_of(x, (self.gate_up_proj,))[0].chunk(2, dim=-1)  # strided views
        return gate, up


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residual connections; the MLP is a `LlamaMLP` or,
    in a mixture-of-experts layer, a `moe.MoeMLP`."""

    def __init__(
        self,
        self_attn: LlamaAttention,
        mlp: nn.Module,
        input_layernorm: RMSNorm,
        post_attention_layernorm: RMSNorm,
    ) -> None:
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer: int,
        cache: KVCache | None,
        mask: torch.Tensor | Segments | None = None,
    ) -> torch.Tensor:
        mid = x + _normed(self.input_layernorm, x, self.self_attn, cos, sin, layer, cache, mask)
        return mid + _normed(self.post_attention_layernorm, mid, self.mlp)


def _normed(
    norm: RMSNorm, x: torch.Tensor, block: Callable[..., torch.Tensor], *args: Any
) -> torch.Tensor:
    """`block(norm(x), *args)`. The block's projections and their adapters would keep the normed
    input; the norm keeps its own input anyway, so backward normalizes again instead (one
    elementwise pass, `recomputing`)."""
    normed = norm(x)
    with recomputing(normed, lambda: norm(x)):
        return block(normed, *args)


class GemmaDecoderLayer(LlamaDecoderLayer):
    """Gemma's sandwich: each block's input and output are normed, then added to the residual."""

    def __init__(
        self,
        self_attn: LlamaAttention,
        mlp: nn.Module,
        input_layernorm: RMSNorm,
        post_attention_layernorm: RMSNorm,
        pre_feedforward_layernorm: RMSNorm,
        post_feedforward_layernorm: RMSNorm,
    ) -> None:
        super().__init__(self_attn, mlp, input_layernorm, post_attention_layernorm)
        self.pre_feedforward_layernorm = pre_feedforward_layernorm
        self.post_feedforward_layernorm = post_feedforward_layernorm

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer: int,
        cache: KVCache | None,
        mask: torch.Tensor | Segments | None = None,
    ) -> torch.Tensor:
        attn = _normed(self.input_layernorm, x, self.self_attn, cos, sin, layer, cache, mask)
        mid = x + self.post_attention_layernorm(attn)
        out = _normed(self.pre_feedforward_layernorm, mid, self.mlp)
        return mid + self.post_feedforward_layernorm(out)


class LlamaModel(nn.Module):
    """The whole causal LM: `embed_tokens`, `layers`, `norm`, `lm_head` (HF names, flat).

    With tied embeddings `lm_head is embed_tokens`. `forward` returns fp32 logits; batches may be
    right-padded (causal attention keeps padding from influencing earlier positions).
    `embed_scale` multiplies the embedding rows, rounded to the compute dtype as HF rounds it to
    the weights' (Gemma's sqrt(hidden)). Sliding layers (`ModelConfig.sliding`) rotate by the
    unscaled rope of `rope_local_theta` when the config has one. The logits are soft-capped
    (`ModelConfig.final_logit_softcapping`) where the config says so (Gemma 2).
    """

    def __init__(
        self,
        config: ModelConfig,
        embed_tokens: FrozenLinear,
        layers: list[LlamaDecoderLayer],
        norm: RMSNorm,
        lm_head: FrozenLinear,
        rope_freq_factors: torch.Tensor | None = None,
        embed_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_scale = embed_scale
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.lm_head = lm_head
        self.rotary = RotaryEmbedding(config, rope_freq_factors)
        self.local_rotary = None
        if config.rope_local_theta is not None:
            local = replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
            self.local_rotary = RotaryEmbedding(local)

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states `[B, T, hidden]`, advancing `cache` when one is given.

        `positions` (`[B, T]`, no cache) are the position ids of packed rows: they restart at 0
        at each example, and a token attends to the earlier tokens of its own example only (those
        since the last position 0), so each example is computed as if alone."""
        past = cache.length if cache is not None else 0
        t = input_ids.shape[1]
        if past + t > self.config.max_position_embeddings:
            raise AnerRuntimeError(
                f"sequence of {past + t} tokens exceeds the model's context length "
                f"{self.config.max_position_embeddings}",
                code="E-CONTEXT",
            )
        mask, length = None, None
        if positions is None:
            positions, length = torch.arange(past, past + t, device=input_ids.device), past + t
        else:
            mask = packed_attention(positions)
        cos, sin = self.rotary(positions, length)
        local = None if self.local_rotary is None else self.local_rotary(positions, length)
        dev = input_ids.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.float32
        h = self.embed_tokens.rows(input_ids).to(dtype)
        if self.embed_scale is not None:
            h = h * torch.tensor(self.embed_scale, dtype=dtype)
        for i, layer in enumerate(self.layers):
            if local is not None and self.config.sliding(i):
                h = run_layer(layer, h, *local, i, cache, mask)
            else:
                h = run_layer(layer, h, cos, sin, i, cache, mask)
        if cache is not None:
            cache.length += t
        return self.norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final-norm hidden states, soft-capped where the config says so."""
        logits = self.lm_head(hidden).to(torch.float32)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, cache))

    def loss(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None = None,
        router_aux: bool = False,
    ) -> torch.Tensor:
        """Summed next-token cross-entropy over `targets` (`IGNORE` where unscored), fp32, of
        plain rows or of packed rows with their `positions` (`hidden_states`).

        In half precision with a frozen head and no final soft-cap, through `head_loss_sum` (no
        full logits held; it cannot cap them); otherwise from the logits, the reference
        arithmetic (`forward`'s logits, bit for bit).
        `router_aux` on a mixture-of-experts model whose `router_aux_loss_coef` is positive adds
        that coefficient times the load-balancing loss per scored token (`moe_aux_loss`)."""
        if router_aux and self.config.router_aux_loss_coef > 0:
            return moe_aux_loss(self, input_ids, targets, positions)
        hidden = self.hidden_states(input_ids, positions=positions)
        frozen = not any(p.requires_grad for p in self.lm_head.parameters())
        capped = self.config.final_logit_softcapping is not None
        with section("loss"):
            if hidden.dtype != torch.float32 and frozen and not capped:
                return head_loss_sum(hidden, self.lm_head, targets)
            return logits_loss_sum(self.logits(hidden), targets)


def moe_aux_loss(
    model: LlamaModel,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor | None,
) -> torch.Tensor:
    """The summed loss plus `router_aux_loss_coef` * load-balancing loss * scored tokens, so the
    trainer's division by the scored tokens gives transformers' mean loss + coef * aux."""
    c = model.config
    with collecting_router_logits() as logits:
        loss = model.loss(input_ids, targets, positions)
    scored = (targets != IGNORE).sum()
    aux = load_balancing_loss(logits, c.num_experts, c.num_experts_per_tok)
    return loss + c.router_aux_loss_coef * aux * scored
