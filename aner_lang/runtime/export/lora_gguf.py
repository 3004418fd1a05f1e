"""An adapter as a llama.cpp LoRA file: ``llama-server -m base.gguf --lora adapter.gguf``.

The layout is the one llama.cpp's ``convert_lora_to_gguf.py`` writes and ``llama_adapter_lora_init``
reads: ``general.architecture`` of the base, ``general.type = adapter``, ``adapter.type = lora``,
``adapter.lora.alpha``, and for every changed weight (GGUF name ``blk.N.attn_q.weight``) the f32
tensors ``<name>.lora_a`` [rank, in] and ``<name>.lora_b`` [out, rank], so that llama.cpp computes
``W' = W + alpha / rank * B A``. The rows of B are permuted as the weight's are (q and k keep
llama.cpp's rotary order), using the architecture table.

Which adapters fit: every one whose change to a weight has rank at most its `rank` (lora,
lora_fa, tinylora). The change is read as `merge` reads it (the adapter's effective weight minus
the base weight: no per-method formula) and factored by SVD at that rank, ``B = U sqrt(S)``,
``A = sqrt(S) V^T``, written with ``alpha = rank`` so llama.cpp's scale is 1. A change that does
not fit in that rank (dora rescales whole rows, full changes every weight) is refused: export the
merged model instead.

On a mixture-of-experts base llama.cpp stores a projection's experts as one 3-D tensor
(``blk.N.ffn_gate_exps.weight``, `Architecture.weights`), and applies a LoRA on it per routed
expert (``ggml_mul_mat_id`` over the adapter's tensors, as over the weight's): each expert's
change is factored alone, and the factors of one projection's experts are stacked in expert
order into ``lora_a`` [experts, rank, in] and ``lora_b`` [experts, out, rank], the layout
llama.cpp's ``convert_lora_to_gguf.py`` writes for MoE adapters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.adapters.merge import effective_weights
from aner_lang.runtime.export.files import gguf_writer
from aner_lang.runtime.io.gguf import permute_rows
from aner_lang.runtime.io.world import once

_FIT = 1e-3
"""Largest relative Frobenius error of the rank-r factorization accepted as the same change."""


def _fail(message: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(f"export_lora_gguf: {message}", code="E-EXPORT", notes=notes)


def low_rank_factors(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(B [out, rank], A [rank, in], relative error) with ``B A`` the best rank-`rank`
    approximation of `delta`."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    root = s[:rank].sqrt()
    b = u[:, :rank] * root
    a = root[:, None] * vh[:rank]
    norm = float(torch.linalg.norm(delta.double()))
    error = float(torch.linalg.norm(delta.double() - b @ a)) / norm if norm > 0 else 0.0
    return b.float(), a.float(), error


def export_lora_gguf(adapter: Any, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write `adapter` as a llama.cpp LoRA GGUF for its base model (see the module docstring)."""
    rank = (getattr(adapter, "config", None) or {}).get("rank")
    if not hasattr(adapter, "targets") or rank is None:
        raise _fail(
            f"a {getattr(adapter, 'method', 'model')} is not a low-rank adapter",
            "export its merged model instead: export_gguf(merge(adapter), path)",
        )
    base = adapter.base
    arch, config = base.architecture, base.config
    weights = effective_weights(adapter)
    tensors = {
        w.name: w
        for w in arch.weights(
            config.num_hidden_layers, config.tie_word_embeddings, config.experts_in
        )
    }
    stacked: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    with (
        gguf_writer(
            path, arch.gguf_architectures[0], overwrite=overwrite, protected=[base.path]
        ) as writer,
        torch.no_grad(),
    ):
        writer.add_string("general.type", "adapter")
        writer.add_string("general.name", f"{base.name} {adapter.method} adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(rank))
        for name, module in adapter.targets:
            weight = tensors[name]
            delta = weights[name] - module.dense_weight().cpu()
            b, a, error = low_rank_factors(delta, rank)
            if error > _FIT:
                raise _fail(
                    f"the {adapter.method} adapter's change to {name} is not of rank {rank} "
                    f"(a rank-{rank} fit misses {error:.1%} of it), so llama.cpp's LoRA cannot "
                    "apply it",
                    "export its merged model instead: export_gguf(merge(adapter), path)",
                )
            if weight.rope_heads:
                b = permute_rows(b, int(getattr(config, weight.rope_heads)))
            if weight.expert is None:
                writer.add_tensor(f"{weight.gguf}.lora_a", np.ascontiguousarray(a.numpy()))
                writer.add_tensor(f"{weight.gguf}.lora_b", np.ascontiguousarray(b.numpy()))
            else:
                stacked.setdefault(weight.gguf, []).append((weight.expert, a.numpy(), b.numpy()))
        for stem, experts in stacked.items():
            experts.sort(key=lambda e: e[0])
            assert [e for e, _, _ in experts] == list(range(len(experts))), stem
            writer.add_tensor(f"{stem}.lora_a", np.stack([a for _, a, _ in experts]))
            writer.add_tensor(f"{stem}.lora_b", np.stack([b for _, _, b in experts]))
    return Path(path)


def export_lora_gguf_builtin(ctx: Any, *, adapter: Any, path: str, overwrite: bool) -> str:
    """Builtin `export_lora_gguf`: `path` is relative to the script; returns the file written
    (by rank 0 alone in a distributed run)."""
    out = ctx.resolve_path(path)
    return str(once(export_lora_gguf, adapter, out, overwrite=overwrite) or out)
