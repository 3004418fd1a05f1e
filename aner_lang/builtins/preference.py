"""Declarations of preference tuning: the data (`load_pairs`, `load_feedback`), the objectives
(`dpo`, `orpo`, `kto`) and the `train` overloads that take them.

Pairs and feedback are their own types, so the checker rejects an objective given data it cannot
train on (`dpo` on `Feedback`, say) and a supervised `train` on pairs. `kto` trains on either (a
pair gives a desirable and an undesirable completion). The dataset operations that apply
(shuffle, take, split, inspect) are the data area's, re-declared for these types; packing does not
apply. Implementations: `aner_lang.runtime.tasks.preference_data`,
`aner_lang.runtime.train.objectives` and the trainer.
"""

from __future__ import annotations

from dataclasses import replace

from aner_lang.builtins import data
from aner_lang.builtins.spec import (
    Builtin,
    Constraint,
    Declarations,
    EnumDecl,
    Field,
    Member,
    Param,
    TypeDecl,
)
from aner_lang.builtins.train import TRAIN

_CATEGORY = "preference"
_NATIVE = ("torch", "gguf", "tokenizers")
_OBJECTIVES = "aner_lang.runtime.train.objectives:"
_DATA = "aner_lang.runtime.tasks.preference_data:"

DPO_LOSS = EnumDecl(
    "DPOLoss",
    (
        Member("sigmoid", "-log σ(β Δ), Δ the chosen minus the rejected log-ratio (DPO)"),
        Member("ipo", "(Δ per token - 1/(2β))², the log-ratios averaged over tokens (IPO)"),
        Member("hinge", "max(0, 1 - β Δ) (SLiC)"),
    ),
    doc="The loss of a DPO objective.",
    category=_CATEGORY,
)

PAIRS = TypeDecl(
    "Pairs",
    "Preference pairs: a prompt with a chosen and a rejected response, from load_pairs(). "
    "Only the responses are scored.",
    category=_CATEGORY,
)
FEEDBACK = TypeDecl(
    "Feedback",
    "Unpaired completions, each labeled desirable or not, from load_feedback() (for kto).",
    category=_CATEGORY,
)
PAIR_OBJECTIVE = TypeDecl(
    "PairObjective",
    "A preference objective that compares the two responses of a pair: dpo() or orpo().",
    category=_CATEGORY,
)
FEEDBACK_OBJECTIVE = TypeDecl(
    "FeedbackObjective",
    "A preference objective on single labeled completions: kto().",
    category=_CATEGORY,
)


def _split_type(kind: str) -> TypeDecl:
    return TypeDecl(
        f"{kind}Split",
        f"Two disjoint parts of a {kind} value, from split().",
        fields=(
            Field("train", kind, "the part to train on"),
            Field("held_out", kind, "the held-out part (validation)"),
        ),
        category=_CATEGORY,
    )


def _ops_for(kind: str) -> tuple[Builtin, ...]:
    """shuffle, take, split and inspect of the data area, for `kind` instead of Dataset."""
    renamed = {"Dataset": kind, "Split": f"{kind}Split"}
    return tuple(
        replace(
            b,
            params=(replace(b.params[0], type=kind),) + b.params[1:],
            returns=renamed.get(b.returns, b.returns),
            examples=(),
        )
        for b in data.DECLARATIONS.builtins
        if b.name in ("shuffle", "take", "split", "inspect")
    )


def _loader(name: str, returns: str, doc: str, example: str) -> Builtin:
    return Builtin(
        name,
        (
            Param(
                "path",
                "String",
                doc="a .jsonl, .csv or .parquet file, relative to the script",
                path="reads",
            ),
            Param(
                "context",
                "Int",
                "512",
                "most tokens of a prompt with one response",
                keyword_only=True,
            ),
            Param(
                "too_long",
                "TooLong",
                "truncate",
                "what happens to a row longer than context (always reported)",
                keyword_only=True,
            ),
        ),
        returns,
        doc,
        _DATA + f"{name}_builtin",
        examples=(example,),
        constraints=(data.CONTEXT_RULE,),
        native=True,
        requires=_NATIVE,
        needs_context=True,
        category=_CATEGORY,
        precheck=f"aner_lang.host.prechecks:{name}",
    )


_KTO_BATCH = Constraint(
    "micro_batch >= 2",
    "kto needs micro_batch >= 2: its KL estimate pairs each prompt with another completion",
)


def _train_for(kind: str, objective: str, doc: str, example: str) -> Builtin:
    """train() with `kind` data (and validation) and a required `objective`; kto's overloads
    default to micro-batches of 2, the fewest its KL estimate works with."""
    kto = objective == "FeedbackObjective"
    typed = {"data": kind, "validation": f"{kind}?"}
    params = tuple(
        replace(
            p,
            type=typed.get(p.name, p.type),
            default="2" if kto and p.name == "micro_batch" else p.default,
        )
        for p in TRAIN.params
    )
    return replace(
        TRAIN,
        params=params
        + (Param("objective", objective, doc="what the preferences teach", keyword_only=True),),
        doc=doc,
        examples=(example,),
        constraints=TRAIN.constraints + ((_KTO_BATCH,) if kto else ()),
        category=_CATEGORY,
    )


def _objective(
    name: str,
    params: tuple[Param, ...],
    returns: str,
    doc: str,
    example: str,
    *constraints: Constraint,
) -> Builtin:
    return Builtin(
        name,
        params,
        returns,
        doc,
        _OBJECTIVES + name,
        examples=(example,),
        constraints=constraints,
        native=True,
        requires=("torch",),
        category=_CATEGORY,
    )


_POSITIVE_BETA = Constraint("beta > 0.0", "beta must be positive")

_BUILTINS = (
    _loader(
        "load_pairs",
        "Pairs",
        "Read preference pairs: `prompt`, `chosen`, `rejected` as strings or chat messages "
        "(rendered with the model's chat template), UltraFeedback's conversations, or Anthropic "
        "HH's Human/Assistant texts. A bad row is an error naming the file and line.",
        'let pairs = load_pairs("data/prefs.jsonl", context: 256)',
    ),
    _loader(
        "load_feedback",
        "Feedback",
        "Read unpaired feedback for kto: `prompt`, `completion` (strings or chat messages) and a "
        "boolean `label` (true: desirable).",
        'let rated = load_feedback("data/rated.jsonl")',
    ),
    _objective(
        "dpo",
        (
            Param("beta", "Float", "0.1", "how far from the reference the policy may move"),
            Param("loss", "DPOLoss", "sigmoid", keyword_only=True),
            Param(
                "label_smoothing",
                "Float",
                "0.0",
                "sigmoid: the assumed chance that a pair's labels are swapped (conservative DPO)",
                keyword_only=True,
            ),
        ),
        "PairObjective",
        "Direct preference optimisation against the reference model: the base with the adapter "
        "off (no copy of its weights).",
        "let objective = dpo(beta: 0.1, loss: sigmoid)",
        _POSITIVE_BETA,
        Constraint(
            "label_smoothing >= 0.0 and label_smoothing < 0.5",
            "label_smoothing must be in [0, 0.5)",
        ),
    ),
    _objective(
        "orpo",
        (Param("lambda", "Float", "0.1", "weight of the odds-ratio term", keyword_only=True),),
        "PairObjective",
        "Odds-ratio preference optimisation: the chosen responses' next-token loss plus lambda "
        "times an odds-ratio penalty; no reference model.",
        "let objective = orpo(lambda: 0.1)",
        Constraint("lambda > 0.0", "lambda must be positive"),
    ),
    _objective(
        "kto",
        (
            Param("beta", "Float", "0.1", "how far from the reference the policy may move"),
            Param("desirable_weight", "Float", "1.0", keyword_only=True),
            Param("undesirable_weight", "Float", "1.0", keyword_only=True),
        ),
        "FeedbackObjective",
        "Kahneman-Tversky optimisation on labeled completions against the reference model (the "
        "base with the adapter off); needs micro_batch >= 2 for its KL estimate.",
        "let objective = kto(beta: 0.1, desirable_weight: 1.0)",
        _POSITIVE_BETA,
        Constraint("desirable_weight > 0.0", "desirable_weight must be positive"),
        Constraint("undesirable_weight > 0.0", "undesirable_weight must be positive"),
    ),
    _train_for(
        "Pairs",
        "PairObjective",
        "Align the adapter on preference pairs with dpo() or orpo(); validation reports the "
        "objective's loss and the held-out preference accuracy.",
        "let run = train(a, pairs, objective: dpo(beta: 0.1), epochs: 2.0)",
    ),
    _train_for(
        "Pairs",
        "FeedbackObjective",
        "Align the adapter with kto() on pairs: each chosen response is desirable, each rejected "
        "one undesirable.",
        "let run = train(a, pairs, objective: kto(), micro_batch: 4)",
    ),
    _train_for(
        "Feedback",
        "FeedbackObjective",
        "Align the adapter with kto() on labeled completions.",
        "let run = train(a, rated, objective: kto(beta: 0.1), micro_batch: 4)",
    ),
    *_ops_for("Pairs"),
    *_ops_for("Feedback"),
)

DECLARATIONS = Declarations(
    builtins=_BUILTINS,
    enums=(DPO_LOSS,),
    types=(
        PAIRS,
        FEEDBACK,
        _split_type("Pairs"),
        _split_type("Feedback"),
        PAIR_OBJECTIVE,
        FEEDBACK_OBJECTIVE,
    ),
)
