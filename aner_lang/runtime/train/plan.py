"""`aner plan FILE`: the GPU memory each `train(...)` call of a script will need, before it runs.

The script is checked, not run: each `train` call's arguments are read from the checked script
(literals and defaults; a name bound by `let` is followed to its value), and its adapter's
`load_model(...)` names the model, of which only the header is read (a GGUF's metadata, a
folder's config.json). No weights load; torch is not imported for a Hugging Face folder (a GGUF
header is read by the runtime's parser, which imports it).

Per call the plan prints the peak by category (`footprint` holds the counting rules, shared with
`memory()`), the tokens per update and the number of updates, and whether the peak fits the GPU:
the one named by `--gpu-memory`, or the first CUDA GPU the driver reports (`aner_lang.host.gpus`). An
argument that is not a constant expression is assumed at its default, and the plan says so.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aner_lang.architectures import ARCHITECTURES
from aner_lang.builtins import members, registry
from aner_lang.builtins.spec import Builtin
from aner_lang.check import Analysis, analyze
from aner_lang.check.analysis import CallInfo
from aner_lang.check.consteval import STATIC_FAILURES, evaluate
from aner_lang.check.core import registry_expr
from aner_lang.check.environment import written_arguments
from aner_lang.host import files, gpus
from aner_lang.host import memory as host_memory
from aner_lang.host.units import human_bytes
from aner_lang.problems.diagnostics import render
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.model_header import gguf_base_bytes, model_config
from aner_lang.runtime.model.chunking import CHUNK_BYTES, mlp_tile_tokens, row_slices
from aner_lang.runtime.model.config import ModelConfig
from aner_lang.runtime.train import accuracy
from aner_lang.runtime.train import footprint as fp
from aner_lang.runtime.train.plan_trace import Frame, NotKnown, Tracer, argument

_ADAPTERS = ("lora", "lora_fa", "dora")
_READ = frozenset(
    ("micro_batch", "accumulation", "steps", "epochs", "rank", "targets", "path", "storage")
    + ("quantize_embeddings",)
    + ("device", "context", "precision", "activations", "optimizer", "kernel", "page_bytes")
)
"""The parameters the plan reads; a non-literal one among them is reported as assumed."""
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


@dataclass
class Call:
    """One builtin call's arguments as the plan takes them."""

    name: str
    args: dict[str, object]
    assumed: list[str] = field(default_factory=list)
    """Parameters written with a non-constant argument, taken at their default."""


@dataclass(frozen=True)
class Plan:
    """Predicted peak GPU bytes of one `train` call, by category, and the pinned host memory
    `offload` keeps the layer inputs in (not part of the GPU's peak)."""

    categories: dict[str, int]
    tokens_per_update: int
    updates: int | None
    pinned_host: int = 0

    @property
    def peak(self) -> int:
        return sum(self.categories.values())


def _defaults(b: Builtin) -> dict[str, object]:
    members = frozenset(m.name for e in registry().enums.values() for m in e.members)
    out: dict[str, object] = {}
    for p in b.params:
        if p.default is not None:
            try:
                out[p.name] = evaluate(registry_expr(p.default), {}, members)
            except STATIC_FAILURES:
                continue
    return out


def _call(tracer: Tracer, info: CallInfo, frame: Frame | None) -> Call:
    assert info.builtin is not None
    known, unknown = tracer.arguments(info, frame)
    return Call(info.name, {**_defaults(info.builtin), **known}, [n for n in unknown if n in _READ])


def parse_bytes(text: str) -> int:
    """`24GB`, `80 GiB`, `1.5e9` -> bytes."""
    t = text.strip().upper().replace(" ", "")
    number = t.rstrip("KMGTIB")
    unit = t[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"{text!r} is not a size such as 24GB or 80GiB")
    return int(float(number) * _UNITS[unit])


def _target_dims(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every projection of a decoder layer."""
    h, f = c.hidden_size, c.intermediate_size
    return {
        "q_proj": (h, c.q_size),
        "k_proj": (h, c.kv_size),
        "v_proj": (h, c.kv_size),
        "o_proj": (c.q_size, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }


_EXPERT_TARGETS = ("gate_proj", "up_proj", "down_proj")


def _expert_inner(c: ModelConfig) -> int:
    """An expert's intermediate size (Mixtral's experts have the dense one)."""
    return c.moe_intermediate_size or c.intermediate_size


def _layer_matrices(
    c: ModelConfig, dims: dict[str, tuple[int, int]], experts: int
) -> list[tuple[str, int, int]]:
    """(target, in, out) of every projection matrix of a layer whose MLP holds `experts`
    experts (0: dense): a sparse layer's MLP targets are each expert's, of the experts' own
    intermediate size."""
    inner = _expert_inner(c)
    own = {"gate_proj": (c.hidden_size, inner), "up_proj": (c.hidden_size, inner),
           "down_proj": (inner, c.hidden_size)}  # fmt: skip
    out = []
    for target, (i, o) in dims.items():
        if experts and target in _EXPERT_TARGETS:
            out += [(target, *own[target])] * experts
        else:
            out.append((target, i, o))
    return out


def _sparse_activation_bytes(
    c: ModelConfig, tokens: int, act: int, rank: int, targets: list[str]
) -> int:
    """What a mixture-of-experts layer keeps for backward: a dense layer's of the routed width
    (each token's k experts side by side: gate and up of k * the experts' intermediate size, a
    LoRA's rows once per routed copy on the MLP targets), plus the routed copies of the input."""
    k, inner = c.num_experts_per_tok, _expert_inner(c)
    shape = fp.LayerShape(c.hidden_size, c.q_size, c.kv_size, k * inner, c.num_attention_heads)
    mlp = sum(t in _EXPERT_TARGETS for t in targets)
    rows = rank * (len(targets) - mlp + k * mlp)
    return fp.layer_activation_bytes(shape, tokens, act, rows) + k * tokens * c.hidden_size * act


def _weight_bytes(numel: int, storage: str) -> int:
    return (
        fp.nf4_bytes(numel)
        if storage == "nf4_double_quant"
        else numel * (2 if storage == "float16" else 4)
    )


def plan(
    c: ModelConfig,
    *,
    storage: str,
    method: str,
    rank: int,
    targets: list[str],
    profile: dict[str, object],
    context: int,
    micro_batch: int,
    accumulation: int,
    updates: int | None,
    cuda: bool = True,
    quantize_embeddings: bool = False,
    file_bytes: int | None = None,
) -> Plan:
    """The predicted peak GPU memory of a LoRA-family run on a model of config `c`; an NF4
    base keeps its embedding and `lm_head` 16-bit unless `quantize_embeddings`. A `storage: gguf`
    base weighs its file's tensor bytes, `file_bytes` (`gguf_base_bytes`), and computes as an NF4
    one does: through the fused kernels' dequant buffer on CUDA, else bounded dequantized tiles."""
    dims = _target_dims(c)
    layers, vocab, h = c.num_hidden_layers, c.vocab_size, c.hidden_size
    experts = [c.experts_in(i) for i in range(layers)]
    tables = [vocab * h] * (1 if c.tie_word_embeddings else 2)
    table_storage = storage
    if storage == "nf4_double_quant" and not quantize_embeddings:
        table_storage = "float16"
    arch = ARCHITECTURES[c.architecture]
    norms = 4 * h * (len(arch.norms) * layers + 1)  # a layer's (Gemma's four), the final one
    if arch.qk_norm:  # Qwen3's and Gemma 3's per-head q and k norms
        norms += 4 * 2 * c.head_dim * layers
    matrices = [m for e in experts for m in _layer_matrices(c, dims, e)]
    weights = sum(_weight_bytes(i * o, storage) for _, i, o in matrices)
    weights += sum(_weight_bytes(e * h, storage) for e in experts if e)  # the routers
    weights += sum(_weight_bytes(n, table_storage) for n in tables) + norms
    if storage == "gguf":
        if file_bytes is None:
            raise ValueError("a storage: gguf plan needs the file's tensor bytes")
        weights = file_bytes
    a_sizes = [rank * i for t, i, _ in matrices if t in targets]
    b_sizes = [rank * o for t, _, o in matrices if t in targets]
    trainable_sizes = (a_sizes if method != "lora_fa" else []) + b_sizes
    if method == "dora":
        trainable_sizes += [o for t, _, o in matrices if t in targets]
    trainable = sum(trainable_sizes)
    adapter_numel = trainable + (sum(a_sizes) if method == "lora_fa" else 0)
    half = profile.get("precision") != "float32"
    act = fp.activation_bytes(str(profile.get("precision")))
    tokens = micro_batch * context
    paged = profile.get("optimizer") == "paged_adamw" and cuda
    managed = fp.managed_optimizer_bytes(trainable_sizes, paged)
    shape = fp.layer_shape(c)
    mode = str(profile.get("activations", "keep"))
    tile = mlp_tile_tokens(c.intermediate_size, act) if mode != "keep" else tokens
    layer = fp.layer_activation_bytes(shape, tokens, act, rank * len(targets), tile)
    per_layer = [layer if not e else _sparse_activation_bytes(c, tokens, act, rank, targets)
                 for e in experts]  # fmt: skip
    inputs = tokens * h * act
    activations = {
        "keep": sum(per_layer),
        "checkpoint": layers * inputs + max(per_layer),
        "offload": max(per_layer),
    }[mode]
    residual = fp.RESIDUAL_COPIES * inputs
    fused = cuda and profile.get("kernel") in ("fused", "auto")
    if half and cuda:  # the fused loss kernel: one chunk's 16-bit logits (loss.chunk_tokens)
        loss = 2 * min(tokens, max(1, CHUNK_BYTES // vocab)) * vocab
    elif half:
        loss = fp.LOSS_WORKSPACE_CHUNKS * min(CHUNK_BYTES, 4 * tokens * vocab)
    else:
        loss = 3 * 4 * tokens * vocab
    graphs = (
        cuda
        and bool(profile.get("graphs", True))
        and mode != "offload"
        and tokens < fp.EAGER_FROM_TOKENS
    )
    packed = storage in ("nf4_double_quant", "gguf")
    if packed and not fused:
        from aner_lang.runtime.nf4.host_tiled import DEFAULT_TILE_BYTES

        tile = fp.dequant_tile_bytes(1, fused, DEFAULT_TILE_BYTES)
    else:
        tile = 0
    shapes = [(o, i) for i, o in dims.values()] + ([(vocab, h)] if table_storage == storage else [])
    largest = max(row_slices(o, i)[0][1] * i for o, i in shapes)  # first slice: (0, most rows)
    dequant = largest * act if packed and fused else tile
    if any(experts) and ((packed and fused) or (half and storage == "float32")):
        # a grouped GEMM's [experts, out, in] stack in the compute dtype: the dequantized experts
        # (`experts.ExpertGroup.stack`), or a float32 stack converted
        dequant = max(dequant, max(experts) * _expert_inner(c) * h * act)
    categories = {
        "base weights": weights,
        "adapter tensors": 4 * adapter_numel + (2 * adapter_numel if half else 0),
        "optimizer state": fp.optimizer_bytes(trainable)
        - managed
        + (int(str(profile.get("page_bytes", 0))) if managed else 0),
        "gradients": 4 * trainable,
        "activations": activations + residual,
        "layer backward": (
            fp.CHECKPOINTED_BACKWARD_FACTOR if mode != "keep" else fp.BACKWARD_FACTOR
        )
        * layer,
        "loss workspace": loss,
        "nf4 dequant buffer": dequant,
        "CUDA workspaces": fp.workspace_bytes(graphs) if cuda else 0,
    }
    pinned = 0
    if mode == "offload" and cuda:
        pinned = fp.offload_host_bytes(layers, tokens, shape, act)
    return Plan(categories, tokens * accumulation, updates, pinned)


def _updates(train: Call, examples: int | None) -> int | None:
    """`steps:`, or the epochs over the examples in whole updates; None when not known."""
    steps = train.args.get("steps")
    if isinstance(steps, int):
        return steps
    if examples is None:
        return None
    epochs = train.args.get("epochs")
    per_update = int(str(train.args["micro_batch"])) * int(str(train.args["accumulation"]))
    return math.ceil((float(str(epochs)) if epochs is not None else 1.0) * examples / per_update)


def plan_calls(analysis: Analysis, info: CallInfo, script_dir: Path) -> list[PlannedCall]:
    """One plan per way the script reaches the `train` call `info` (once at the top level, once
    per call of the function it is in)."""
    tracer = Tracer(analysis)
    head = f"train() at line {info.call.span.line}"
    frames = list(tracer.instances(info))
    if not frames:
        return [PlannedCall([f"{head}: not planned: the function it is in is never called"], None)]
    return [plan_call(tracer, info, frame, script_dir) for frame in frames]


@dataclass(frozen=True)
class PlannedCall:
    """The report lines of one planned `train` call and its predicted peak (None: not planned);
    `at(activations, context)`, the plan of the same call under another activation policy and
    data context, up to `max_context` (the model's context length)."""

    lines: list[str]
    peak: int | None
    at: Callable[[str, int], Plan] | None = None
    max_context: int = 0


def plan_call(tracer: Tracer, info: CallInfo, frame: Frame | None, script_dir: Path) -> PlannedCall:
    """The plan of the `train` call `info` run in `frame`."""
    head = f"train() at line {info.call.span.line}"
    if frame is not None:
        head += f" (called from line {frame.line})"
    train = _call(tracer, info, frame)
    try:
        adapter_info, adapter_frame = tracer.builtin(argument(info, "adapter"), frame)
    except NotKnown:
        return PlannedCall([f"{head}: cannot plan: the adapter is not known before the run"], None)
    if adapter_info.name not in _ADAPTERS:
        return PlannedCall(
            [
                f"{head}: cannot plan: the adapter is {adapter_info.name} "
                f"(plan covers {', '.join(_ADAPTERS)})"
            ],
            None,
        )
    adapter = _call(tracer, adapter_info, adapter_frame)
    try:
        model_info, model_frame = tracer.builtin(argument(adapter_info, "model"), adapter_frame)
    except NotKnown:
        model_info = None
    if model_info is None or model_info.name != "load_model":
        return PlannedCall(
            [f"{head}: cannot plan: the adapter's model is not a load_model(...) call"], None
        )
    model = _call(tracer, model_info, model_frame)
    if not isinstance(model.args.get("path"), str):
        return PlannedCall(
            [f"{head}: cannot plan: the model path is not known before the run"], None
        )
    data = tracer.dataset(argument(info, "data"), frame)
    profile_builtin = registry().functions["profile"][0]
    notes: list[str] = []
    try:
        profile_info, profile_frame = tracer.builtin(argument(info, "profile"), frame)
        profile: Call | None = _call(tracer, profile_info, profile_frame)
    except NotKnown:
        profile = None
        if id(argument(info, "profile")) in written_arguments(info):
            notes.append("the profile is not known before the run; assumed profile()'s defaults")
    profile_args = profile.args if profile else _defaults(profile_builtin)
    storage = str(model.args["storage"])
    path = str(model.args["path"])
    file_bytes = gguf_base_bytes(path, script_dir) if storage == "gguf" else None
    config = model_config(path, script_dir)
    if data.context is None:
        context = config.max_position_embeddings
        notes.append(
            f"the dataset's context is not known before the run; assumed the model's "
            f"context length ({context}), the largest a row can be"
        )
    else:
        context = data.context
    cuda = model.args.get("device") != "cpu"

    def planned(settings: dict[str, object], context: int) -> Plan:
        return plan(
            config,
            storage=storage,
            method=adapter.name,
            rank=int(str(adapter.args["rank"])),
            targets=[str(t) for t in adapter.args["targets"]]  # type: ignore[attr-defined]
            if isinstance(adapter.args.get("targets"), list)
            else [],
            profile=settings,
            context=context,
            micro_batch=int(str(train.args["micro_batch"])),
            accumulation=int(str(train.args["accumulation"])),
            updates=_updates(train, data.examples),
            cuda=cuda,
            quantize_embeddings=model.args.get("quantize_embeddings") is True,
            file_bytes=file_bytes,
        )

    def at(activations: str, context: int) -> Plan:
        return planned({**profile_args, "activations": activations}, context)

    result = planned(profile_args, context)
    through = f" (through {', '.join(reversed(data.path))})" if data.path else ""
    out = [
        f"{head}: {adapter.name} rank {adapter.args['rank']} on {model.args['path']} "
        f"({config.num_hidden_layers} layers, {model.args['storage']}), "
        f"{profile_args.get('precision')}, activations {profile_args.get('activations')}, "
        f"context {context}{through}{', packed' if data.packed else ''}, "
        f"micro_batch {train.args['micro_batch']}"
    ]
    out += [f"  {name:<20} {human_bytes(n):>12}" for name, n in result.categories.items()]
    out.append(f"  {'peak':<20} {human_bytes(result.peak):>12}")
    if result.pinned_host:
        out.append(
            f"  pinned host memory {human_bytes(result.pinned_host)}: offload's copies of the "
            f"layer inputs and what their attention blocks keep, beside the peak{_host_note(result.pinned_host)}"
        )
    out.append(f"  tokens per update: {result.tokens_per_update}")
    updates = "not known before the run" if result.updates is None else str(result.updates)
    out.append(f"  updates: {updates}")
    out.append("  " + accuracy.statement(config, context, cuda))
    for call in (train, adapter, model, *(c for c in (profile,) if c is not None)):
        out += [
            f"  {call.name}: {n} is not known before the run; assumed at its default"
            for n in call.assumed
        ]
    out += [f"  {n}" for n in notes]
    return PlannedCall(out, result.peak, at if cuda else None, config.max_position_embeddings)


CONTEXT_STEP = 256
"""The resolution of `longest_context`."""


def longest_context(fits: Callable[[int], bool], most: int, step: int = CONTEXT_STEP) -> int | None:
    """The longest context among `step`, 2 `step`, ... and `most` for which `fits(context)`
    (None: not even the shortest), by bisection. A planned peak grows with the context but
    where micro-batches reach `EAGER_FROM_TOKENS` tokens and stop recording CUDA graphs (one
    workspace less), so bisection may miss a context just below that which fits; the answer
    always fits."""
    contexts = list(range(step, most, step)) + [most]
    if not fits(contexts[0]):
        return None
    good, bad = 0, len(contexts)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(contexts[middle]) else (good, middle)
    return contexts[good]


def _host_note(pinned: int) -> str:
    """What this machine's available host memory says of `pinned` bytes of pinned copies."""
    available = host_memory.available_bytes()
    if available is None:
        return ""
    if pinned <= available:
        return f" (within the {human_bytes(available)} this machine has available)"
    return (
        f" (more than the {human_bytes(available)} this machine has available: a run here keeps "
        "what fits beside the layer inputs and recomputes the rest)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="aner plan",
        description="predict each train() call's peak GPU memory (no weights load)",
    )
    ap.add_argument("file")
    ap.add_argument(
        "--gpu-memory", help="the GPU's memory (24GB, 80GiB); default: the detected GPU"
    )
    args = ap.parse_args(argv)
    try:
        limit = parse_bytes(args.gpu_memory) if args.gpu_memory else None
    except ValueError as e:
        print(f"aner plan: {e}", file=sys.stderr)
        return 2
    try:
        source = files.read_text(args.file, files.SCRIPT_LIMIT)
    except AnerRuntimeError as e:
        print(f"{args.file}: error[{e.code}]: {e.message}", file=sys.stderr)
        return 1
    analysis = analyze(source, args.file)
    for d in analysis.errors:
        print(render(d, source), file=sys.stderr)
    if analysis.errors:
        return 1
    if limit is not None:
        gpu = f"the named GPU ({human_bytes(limit)})"
    else:
        found = gpus.detect()
        limit = found[0].total_bytes if found else None
        gpu = f"{found[0].name} ({human_bytes(found[0].total_bytes)})" if found else ""
    calls = sorted(
        (i for i in analysis.calls.values() if i.kind == "builtin" and i.name == "train"),
        key=lambda i: i.call.span.start,
    )
    if not calls:
        print(f"{args.file}: no train() call to plan")
        return 0
    script_dir = Path(args.file).resolve().parent
    too_big = False
    for info in calls:
        try:
            planned = plan_calls(analysis, info, script_dir)
        except AnerRuntimeError as e:
            print(f"{args.file}: error[{e.code}]: {e.message}", file=sys.stderr)
            return 1
        for p in planned:
            too_big |= _verdict(p, limit, gpu)
    return 1 if too_big else 0


def _verdict(planned: PlannedCall, limit: int | None, gpu: str) -> bool:
    """Print one planned call and whether it fits; True when it will not."""
    print("\n".join(planned.lines))
    if planned.peak is None:
        return False
    if limit is None:
        print("  no CUDA GPU detected: name one with --gpu-memory to compare")
        return False
    fits = planned.peak <= limit
    print(f"  {'fits' if fits else 'will NOT fit'} on {gpu}")
    if planned.at is not None:
        at, cap = planned.at, limit

        def fitting(mode: str) -> Callable[[int], bool]:
            return lambda context: at(mode, context).peak <= cap

        said = []
        for mode in members("Activations"):
            n = longest_context(fitting(mode), planned.max_context)
            pinned = at(mode, n).pinned_host if n is not None else 0
            host = f" (pinning {human_bytes(pinned)} of host memory)" if pinned else ""
            said.append(f"{mode} {'none' if n is None else f'{n:,}'}{host}")
        print(f"  longest context that fits on {gpu}, by activations: {', '.join(said)}")
    return not fits
