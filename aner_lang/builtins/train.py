"""Declarations of the trainer builtins: adapter methods, profiles, loss scales and train().

Implementations live in `aner_lang.runtime.adapters`, `.profile` and `.trainer` and load only
when first called. Every range rule is a constraint, so the checker rejects literal mistakes
(`rank: 0`, `backoff_factor: 2.0`) before any model loads; rules that need the machine or the
model (fused without CUDA, full on an NF4 base) are checked at run time with a clear message.
"""

from __future__ import annotations

from aner_lang.architectures import all_targets
from aner_lang.builtins.model import overloads_for
from aner_lang.builtins.spec import (
    NATIVE,
    Builtin,
    Constraint,
    Declarations,
    EnumDecl,
    Field,
    Member,
    Param,
    TypeDecl,
)

_CATEGORY = "training"
_ADAPTERS = "aner_lang.runtime.adapters:"
_PROFILE = "aner_lang.runtime.train.profile:"

PRECISION = EnumDecl(
    "Precision",
    (
        Member("float32", "fp32 forward and backward"),
        Member("float16", "fp16 autocast forward with dynamic loss scaling by default"),
        Member("bfloat16", "bf16 autocast forward; no loss scaling needed"),
    ),
    doc="Compute precision of an update; master weights and moments are always fp32.",
    category=_CATEGORY,
)
OPTIMIZER = EnumDecl(
    "Optimizer",
    (
        Member("adamw", "AdamW on fp32 masters, identical to torch.optim.AdamW"),
        Member(
            "paged_adamw",
            "AdamW with large moments in CUDA managed memory, prefetched page by "
            "page; plain AdamW on CPU",
        ),
    ),
    doc="The optimizer of a profile.",
    category=_CATEGORY,
)
KERNEL = EnumDecl(
    "Kernel",
    (
        Member("host_tiled", "dequantize bounded NF4 tiles, then matmul (any device)"),
        Member("fused", "NVRTC-compiled CUDA NF4 kernels (CUDA only)"),
        Member("auto", "fused on CUDA, host_tiled elsewhere"),
    ),
    doc="Which NF4 linear path an update uses.",
    category=_CATEGORY,
)
TARGET = EnumDecl(
    "Target",
    tuple(Member(p.target, p.doc) for p in all_targets()),
    doc="A projection an adapter changes (the names of `aner_lang.architectures`).",
    category=_CATEGORY,
)
ACTIVATIONS = EnumDecl(
    "Activations",
    (
        Member("keep", "every activation backward needs stays on the device (fastest)"),
        Member(
            "checkpoint",
            "per decoder layer only its input is kept; the layer runs again in backward "
            "(about a third more compute, far less memory; gradients bit-identical, but a "
            "micro-batch of more tokens than one MLP tile runs its MLPs tile by tile, whose "
            "sums over tokens round otherwise)",
        ),
        Member(
            "offload",
            "checkpoint, with the kept layer inputs in pinned host memory (copied asynchronously)",
        ),
    ),
    doc="What an update keeps of the forward pass for its backward.",
    category=_CATEGORY,
)
SHARING = EnumDecl(
    "Sharing",
    (
        Member("global", "one trainable vector shared by every target tensor"),
        Member("per_module", "one trainable vector per target tensor"),
    ),
    doc="How TinyLoRA shares its trainable numbers.",
    category=_CATEGORY,
)
SCHEDULE = EnumDecl(
    "Schedule",
    (
        Member("constant", "the learning rate after warmup stays constant"),
        Member("linear", "linear decay to 0 at the last update"),
        Member("cosine", "cosine decay to 0 at the last update"),
    ),
    doc="Learning-rate schedule after the warmup updates.",
    category=_CATEGORY,
)

ADAPTER = TypeDecl(
    "Adapter",
    "Trainable fp32 tensors attached to a frozen base model; runs "
    "anywhere a Model does (evaluate, generate).",
    fields=(
        Field("method", "String", "lora, lora_fa, dora, tinylora or full"),
        Field("trainable_parameters", "Int", "how many numbers training changes"),
        Field("target_tensors", "Int", "how many base tensors the adapter changes"),
    ),
    category=_CATEGORY,
)
PROFILE = TypeDecl(
    "Profile",
    "How an update runs: precision, optimizer, kernel, paging, loss scale.",
    fields=(
        Field("precision", "Precision"),
        Field("optimizer", "Optimizer"),
        Field("kernel", "Kernel"),
        Field("page_bytes", "Bytes", "paged AdamW prefetch granularity"),
        Field("activations", "Activations", "what an update keeps for backward"),
    ),
    category=_CATEGORY,
)
LOSS_SCALE = TypeDecl(
    "LossScale",
    "A loss-scaling rule for float16 training.",
    fields=(
        Field("kind", "String", "dynamic or fixed"),
        Field("scale", "Float", "the (initial) scale"),
    ),
    category=_CATEGORY,
)
RUN = TypeDecl(
    "Run",
    "The result of train().",
    fields=(
        Field("adapter", "Adapter", "the trained adapter (the one passed in)"),
        Field("loss_history", "List[Float]", "training loss of every applied update"),
        Field("final_loss", "Float?", "training loss of the last applied update"),
        Field("validation_loss", "Float?", "validation loss after the last update"),
        Field("first_validation_loss", "Float?", "validation loss after the first update"),
        Field("best_validation_loss", "Float?", "the lowest validation loss"),
        Field("best_update", "Int?", "the update of the lowest validation loss"),
        Field(
            "validation_accuracy",
            "Float?",
            "held-out preference accuracy after the last update (dpo, orpo)",
        ),
        Field(
            "first_validation_accuracy",
            "Float?",
            "held-out preference accuracy after the first update (dpo, orpo)",
        ),
        Field("stopped_early", "Bool", "early stopping (patience) ended the training"),
        Field("epochs", "Float", "passes over the training examples done"),
        Field("scored_tokens", "Int", "scored tokens of all applied updates"),
        Field("updates", "Int", "accumulation windows done (applied and skipped)"),
        Field("skipped_updates", "Int", "windows skipped after max_retries overflows"),
        Field("retries", "Int", "windows re-run with a backed-off loss scale"),
        Field("loss_scale", "Float", "the loss scale at the end"),
        Field("optimizer_report", "String", "where the optimizer moments live"),
        Field("tokens_per_second", "Float", "scored tokens per second of this call"),
        Field("log_path", "String?", "the JSON-lines event log, one event per update"),
        Field(
            "cuda_graphs",
            "String",
            "on, or off and why (updates replayed from CUDA graphs: see profile graphs)",
        ),
        Field(
            "kernel_identity",
            "String",
            "what the numbers depend on: NF4 kernel (name, source sha256, arithmetic), torch, "
            "device; a resumed run must match it",
        ),
    ),
    category=_CATEGORY,
)

_TARGETS = Param(
    "targets", "List[Target]", "[q_proj, v_proj]", "projections to adapt", keyword_only=True
)
_SEED = Param("seed", "Int", "0", "seed of the random initialisation", keyword_only=True)
_RANK_RULES = (
    Constraint("rank >= 1", "rank must be at least 1"),
    Constraint("alpha > 0.0", "alpha must be positive"),
    Constraint("dropout >= 0.0 and dropout < 1.0", "dropout must be in [0, 1)"),
)


def _low_rank(name: str, doc: str, example: str) -> Builtin:
    return Builtin(
        name,
        (
            Param("model", "Model", doc="the frozen base"),
            Param("rank", "Int", "8", "rank r of the update", keyword_only=True),
            Param(
                "alpha",
                "Float",
                "16.0",
                "scaling numerator: the update is scaled by alpha / rank",
                keyword_only=True,
            ),
            Param("dropout", "Float", "0.0", "dropout on the adapter's input", keyword_only=True),
            _TARGETS,
            _SEED,
        ),
        "Adapter",
        doc,
        _ADAPTERS + name,
        examples=(example,),
        constraints=_RANK_RULES,
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    )


_BUILTINS = (
    _low_rank(
        "lora",
        "LoRA (QLoRA on an NF4 base): y = W x + alpha/rank * B A x, A "
        "kaiming-uniform, B zero, both trained.",
        "let a = lora(base, rank: 2, alpha: 4.0, targets: [q_proj, v_proj], seed: 71)",
    ),
    _low_rank(
        "lora_fa",
        "LoRA-FA: like lora, but A stays frozen at its random init and only B "
        "is trained (fewer trainable numbers, less activation memory).",
        "let a = lora_fa(base, rank: 2, alpha: 4.0)",
    ),
    _low_rank(
        "dora",
        "DoRA: a LoRA direction plus a trainable magnitude per output row, "
        "initialised to the row norms of W.",
        "let a = dora(base, rank: 2, alpha: 4.0)",
    ),
    Builtin(
        "tinylora",
        (
            Param("model", "Model", doc="the frozen base"),
            Param(
                "parameters",
                "Int",
                "13",
                "trainable numbers (per sharing group)",
                keyword_only=True,
            ),
            Param(
                "sharing",
                "Sharing",
                "global",
                "one vector for all targets, or one per target",
                keyword_only=True,
            ),
            Param("rank", "Int", "2", "rank of the fixed SVD bases", keyword_only=True),
            _TARGETS,
            _SEED,
        ),
        "Adapter",
        "TinyLoRA: W' = W + U S (sum_i v_i P_i) V^T over the fixed rank-r SVD of "
        "each unquantized target weight and fixed random projections P; only v is trained.",
        _ADAPTERS + "tinylora",
        examples=("let t = tinylora(base, parameters: 13, rank: 2)",),
        constraints=(
            Constraint("rank >= 1", "rank must be at least 1"),
            Constraint("parameters >= 1", "parameters must be at least 1"),
        ),
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "full",
        (Param("model", "Model", doc="a base with dense (float32/float16) storage"),),
        "Adapter",
        "Full fine-tuning: every weight and norm becomes a trainable fp32 master (the "
        "base itself is not changed). Needs dense storage, not nf4_double_quant.",
        _ADAPTERS + "full",
        examples=("let f = full(dense_base)",),
        native=True,
        requires=NATIVE,
        category=_CATEGORY,
    ),
    Builtin(
        "dynamic",
        (
            Param("initial", "Float", "65536.0", "initial scale", keyword_only=True),
            Param(
                "growth_interval",
                "Int",
                "2000",
                "good updates before the scale grows",
                keyword_only=True,
            ),
            Param("growth_factor", "Float", "2.0", keyword_only=True),
            Param("backoff_factor", "Float", "0.5", keyword_only=True),
            Param(
                "max_retries",
                "Int",
                "3",
                "re-runs of an overflowing window before it is skipped",
                keyword_only=True,
            ),
        ),
        "LossScale",
        "Dynamic loss scaling with torch GradScaler's semantics: an overflow skips "
        "the update and backs the scale off; growth after growth_interval good updates.",
        _PROFILE + "dynamic",
        examples=("let ls = dynamic(initial: 128.0, growth_interval: 2)",),
        constraints=(
            Constraint("initial > 0.0", "initial must be positive"),
            Constraint("growth_interval >= 1", "growth_interval must be at least 1"),
            Constraint("growth_factor > 1.0", "growth_factor must be above 1"),
            Constraint(
                "backoff_factor > 0.0 and backoff_factor < 1.0", "backoff_factor must be in (0, 1)"
            ),
            Constraint("max_retries >= 0", "max_retries must not be negative"),
        ),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "fixed",
        (Param("scale", "Float", doc="the constant loss scale"),),
        "LossScale",
        "A constant loss scale; an overflowing update is still skipped.",
        _PROFILE + "fixed",
        examples=("let ls = fixed(1024.0)",),
        constraints=(Constraint("scale > 0.0", "scale must be positive"),),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "profile",
        (
            Param("precision", "Precision", "float32", keyword_only=True),
            Param("optimizer", "Optimizer", "adamw", keyword_only=True),
            Param("kernel", "Kernel", "auto", keyword_only=True),
            Param("page_bytes", "Bytes", "2 MiB", "paged AdamW prefetch page", keyword_only=True),
            Param(
                "loss_scale",
                "LossScale?",
                "none",
                "none: dynamic() for float16, no scaling otherwise",
                keyword_only=True,
            ),
            Param(
                "memory_budget",
                "Bytes?",
                "none",
                "memory the run may use: it runs the fastest activations policy, activations: "
                "or one keeping less, whose planned peak (as aner plan counts) fits, and says "
                "which; an error before training when none fits or the GPU has less free",
                keyword_only=True,
            ),
            Param(
                "activations",
                "Activations",
                "keep",
                "keep, or checkpoint (optionally offload) per decoder layer",
                keyword_only=True,
            ),
            Param(
                "graphs",
                "Bool",
                "true",
                "replay each batch shape's forward and backward from a CUDA graph (CUDA, no "
                "dropout, activations: keep or checkpoint); the same numbers, without the host "
                "in the step; micro-batches long enough to keep the GPU busy run eagerly",
                keyword_only=True,
            ),
        ),
        "Profile",
        "How updates run. fp32 master weights always; kernel: fused needs CUDA.",
        _PROFILE + "profile",
        examples=(
            "let fast = profile(precision: float16, optimizer: paged_adamw, kernel: fused, "
            "page_bytes: 2 MiB, loss_scale: dynamic(initial: 128.0))",
        ),
        constraints=(Constraint("page_bytes >= 4 KiB", "page_bytes must be at least 4 KiB"),),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
        precheck="aner_lang.host.prechecks:profile",
    ),
    Builtin(
        "train",
        (
            Param("adapter", "Adapter", doc="what to train (continues a resumed one)"),
            Param("data", "Dataset", doc="training examples"),
            Param("profile", "Profile", "profile()", "how updates run"),
            Param(
                "steps",
                "Int?",
                "none",
                "total updates the adapter's training reaches (none: from epochs)",
                keyword_only=True,
            ),
            Param(
                "epochs",
                "Float?",
                "none",
                "passes over the data instead of steps (none with no steps: 1)",
                keyword_only=True,
            ),
            Param("learning_rate", "Float", "2e-4", keyword_only=True),
            Param("micro_batch", "Int", "1", "examples per forward pass", keyword_only=True),
            Param("accumulation", "Int", "1", "micro-batches per update", keyword_only=True),
            Param(
                "clip_norm",
                "Float?",
                "1.0",
                "global gradient-norm clip (none: off)",
                keyword_only=True,
            ),
            Param("seed", "Int", "0", "data order and dropout seed", keyword_only=True),
            Param(
                "shuffle",
                "Bool",
                "true",
                "a new seeded order every epoch (false: the dataset's order)",
                keyword_only=True,
            ),
            Param(
                "weight_decay", "Float", "0.0", "AdamW decoupled weight decay", keyword_only=True
            ),
            Param("warmup", "Int", "0", "linear warmup updates", keyword_only=True),
            Param("schedule", "Schedule", "constant", keyword_only=True),
            Param("validation", "Dataset?", "none", "held-out examples", keyword_only=True),
            Param(
                "eval_every",
                "Int",
                "0",
                "validate every n updates (and after the first and last)",
                keyword_only=True,
            ),
            Param(
                "patience",
                "Int",
                "0",
                "stop after n validations without a new best (0: never)",
                keyword_only=True,
            ),
            Param(
                "checkpoints",
                "String?",
                "none",
                "checkpoint directory",
                keyword_only=True,
                path="writes_folder",
            ),
            Param(
                "checkpoint_every",
                "Int",
                "0",
                "checkpoint every n updates (and after the last)",
                keyword_only=True,
            ),
            Param(
                "log",
                "String?",
                "none",
                "JSON-lines event log (default: <checkpoints>/events.jsonl)",
                keyword_only=True,
                path="writes",
            ),
            Param(
                "log_dir",
                "String?",
                "none",
                "a folder for TensorBoard event files",
                keyword_only=True,
                path="writes_folder",
            ),
        ),
        "Run",
        "Train the adapter for `steps` updates or `epochs` passes over the data; deterministic "
        "for a seed. With validation, the best checkpoint is kept in <checkpoints>/best and "
        "`patience` stops early; Ctrl-C stops after the current update with a checkpoint.",
        "aner_lang.runtime.train.trainer:train_builtin",
        examples=(
            "let run = train(a, train_set, fast, steps: 20, learning_rate: 2e-4, "
            "clip_norm: 1.0, seed: 11, validation: held_out)",
        ),
        constraints=(
            Constraint("steps >= 1", "steps must be at least 1"),
            Constraint("epochs > 0.0", "epochs must be positive"),
            Constraint("steps == none or epochs == none", "give steps or epochs, not both"),
            Constraint("patience >= 0", "patience must not be negative"),
            Constraint("learning_rate > 0.0", "learning_rate must be positive"),
            Constraint("micro_batch >= 1", "micro_batch must be at least 1"),
            Constraint("accumulation >= 1", "accumulation must be at least 1"),
            Constraint("weight_decay >= 0.0", "weight_decay must not be negative"),
            Constraint("warmup >= 0", "warmup must not be negative"),
            Constraint("eval_every >= 0", "eval_every must not be negative"),
            Constraint("checkpoint_every >= 0", "checkpoint_every must not be negative"),
        ),
        native=True,
        requires=NATIVE,
        needs_context=True,
        category=_CATEGORY,
    ),
    Builtin(
        "plot",
        (
            Param("log", "String", doc="the JSON-lines event log train() wrote", path="reads"),
            Param("to", "String", doc="the picture to write: a .png or .svg file", path="writes"),
            Param(
                "overwrite",
                "Bool",
                "false",
                doc="replace an existing picture",
                keyword_only=True,
            ),
        ),
        "String",
        "Draw a run's training and validation loss by update from its event log (what "
        "`aner plot` does); returns the path written. Paths are relative to the script.",
        "aner_lang.datafiles.plot:plot_builtin",
        examples=('plot("runs/chat/events.jsonl", "runs/chat/loss.svg")',),
        native=True,
        requires=("matplotlib",),
        needs_context=True,
        category=_CATEGORY,
    ),
)

TRAIN = next(b for b in _BUILTINS if b.name == "train")
"""train() on a supervised dataset; the preference overloads extend it (`builtins.preference`)."""

DECLARATIONS = Declarations(
    builtins=_BUILTINS + overloads_for("Adapter"),
    enums=(PRECISION, OPTIMIZER, KERNEL, ACTIVATIONS, TARGET, SHARING, SCHEDULE),
    types=(ADAPTER, PROFILE, LOSS_SCALE, RUN),
)
