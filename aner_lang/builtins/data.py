"""Declarations of the dataset builtins: reading data files in their formats, the dataset
operations (shuffle, take, split, pack) and `inspect`. Implementations live in
`aner_lang.runtime.tasks` and load only when first called; the file formats themselves are
`aner_lang.datafiles.records` (torch-free, so `aner check` reads the first rows of a literal path with the
same rules, through each reader's `precheck`).
"""

from __future__ import annotations

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

_CATEGORY = "data"
_DATA = "aner_lang.runtime.tasks.data:"
_OPS = "aner_lang.runtime.tasks.dataset_ops:"
_PRECHECK = "aner_lang.host.prechecks:"

DATA_FORMAT = EnumDecl(
    "DataFormat",
    (
        Member("auto", "chat, alpaca, prompt_completion or text, from the first fields a row has"),
        Member("text", "a text field (`field:`, default `text`); every token scored"),
        Member(
            "prompt_completion",
            "`prompt_field:` (default `prompt`, unscored) and `completion_field:` "
            "(default `completion`)",
        ),
        Member(
            "chat",
            "OpenAI `messages` (role/content; system, user, assistant, tool) or ShareGPT "
            "`conversations` (from/value), rendered with the model's chat template",
        ),
        Member(
            "alpaca",
            "`instruction`, optional `input`, `output`, with the Alpaca prompt (or `template:`)",
        ),
        Member(
            "alpaca_chat",
            "the alpaca fields as a user turn and an assistant turn, through the model's chat "
            "template",
        ),
    ),
    doc="How the rows of a data file become examples.",
    category=_CATEGORY,
)
LOSS_ON = EnumDecl(
    "LossOn",
    (
        Member(
            "responses",
            "what the model should produce: the assistant's turns, a completion, an output; "
            "every token of a plain text",
        ),
        Member("all", "every token, prompts and chat-template markup included"),
    ),
    doc="Which tokens of an example the loss is computed on.",
    category=_CATEGORY,
)
TOO_LONG = EnumDecl(
    "TooLong",
    (
        Member("truncate", "keep the first `context` tokens (dropped if nothing scored is left)"),
        Member("drop", "leave the example out"),
    ),
    doc="What happens to an example longer than the context; either is reported as a warning.",
    category=_CATEGORY,
)

DATASET = TypeDecl(
    "Dataset",
    "Examples read from a file or a list, tokenized with a model's tokenizer when used; only the "
    "tokens the loss is on are scored (`inspect` shows which).",
    category=_CATEGORY,
)
SPLIT = TypeDecl(
    "Split",
    "Two disjoint parts of a dataset, from split().",
    fields=(
        Field("train", "Dataset", "the examples to train on"),
        Field("held_out", "Dataset", "the held-out examples (validation)"),
    ),
    category=_CATEGORY,
)


def _data(name: str, doc: str = "the dataset") -> Param:
    return Param(name, "Dataset", doc=doc)


CONTEXT_RULE = Constraint("context >= 2", "context must be at least 2 tokens")
"""Every data builtin's `context`: one token leaves nothing to score (a scored token is predicted
from the tokens before it), so `context: 1` is refused where it is written, before any model
loads. Whether a larger context leaves a scored token depends on the tokenizer and the rows
(E-TRAIN-DATA): `aner run` checks it before the script runs where the model and the data are
known (`aner_lang.runtime.train.data_precheck`), `train` where they are not."""

_BUILTINS = (
    Builtin(
        "texts",
        (
            Param("items", "List[String]", doc="one training text per example"),
            Param(
                "context",
                "Int",
                "128",
                "most tokens per example (longer texts are truncated, with a warning)",
                keyword_only=True,
            ),
        ),
        "Dataset",
        "A dataset of plain texts; every token is scored.",
        _DATA + "texts_builtin",
        examples=('let train_set = texts(["Aner makes adaptation explicit."], context: 32)',),
        constraints=(CONTEXT_RULE,),
        category=_CATEGORY,
    ),
    Builtin(
        "load_jsonl",
        (
            Param("path", "String", doc="a JSON Lines file, one object a line", path="reads"),
            Param(
                "field",
                "String",
                '"text"',
                "the text field (when there is no prompt/completion pair)",
                keyword_only=True,
            ),
            Param(
                "prompt_field",
                "String?",
                "none",
                "field with the prompt (unscored)",
                keyword_only=True,
            ),
            Param(
                "completion_field",
                "String?",
                "none",
                "field with the completion (scored)",
                keyword_only=True,
            ),
            Param("context", "Int", "128", "most tokens per example", keyword_only=True),
        ),
        "Dataset",
        "Read a JSONL dataset: texts, or prompt/completion pairs where only the "
        "completion is scored (`load_data` reads every format).",
        _DATA + "load_jsonl_builtin",
        examples=(
            'let qa = load_jsonl("data/qa.jsonl", prompt_field: "question", '
            'completion_field: "answer")',
        ),
        constraints=(CONTEXT_RULE,),
        needs_context=True,
        category=_CATEGORY,
        precheck=_PRECHECK + "load_jsonl",
    ),
    Builtin(
        "load_data",
        (
            Param(
                "path",
                "String",
                doc="a .jsonl, .txt (one example a line), .csv or .parquet file, relative to "
                "the script",
                path="reads",
            ),
            Param("format", "DataFormat", "auto", "how rows become examples", keyword_only=True),
            Param(
                "field",
                "String?",
                "none",
                "the text field (text), or the messages field (chat); none: text, messages "
                "or conversations",
                keyword_only=True,
            ),
            Param(
                "prompt_field",
                "String?",
                "none",
                "prompt_completion: none is `prompt`",
                keyword_only=True,
            ),
            Param(
                "completion_field",
                "String?",
                "none",
                "prompt_completion: none is `completion`",
                keyword_only=True,
            ),
            Param(
                "template",
                "String?",
                "none",
                "alpaca: the prompt, with {instruction} and {input} replaced (none: Alpaca's)",
                keyword_only=True,
            ),
            Param("context", "Int", "512", "most tokens per example", keyword_only=True),
            Param("loss_on", "LossOn", "responses", "which tokens are scored", keyword_only=True),
            Param(
                "too_long",
                "TooLong",
                "truncate",
                "what happens to an example longer than context (always reported)",
                keyword_only=True,
            ),
        ),
        "Dataset",
        "Read a data file in any format Aner knows: chat conversations (rendered with the "
        "model's own chat template, loss on the assistant's turns), alpaca instructions, "
        "prompt/completion pairs or texts. A bad row is an error naming the file and line.",
        _DATA + "load_data_builtin",
        examples=(
            'let chats = load_data("data/chats.jsonl", format: chat, context: 1024)',
            'let notes = load_data("data/notes.parquet", field: "body")',
        ),
        constraints=(CONTEXT_RULE,),
        native=True,
        requires=NATIVE,
        lets_go=False,
        needs_context=True,
        category=_CATEGORY,
        precheck=_PRECHECK + "load_data",
    ),
    Builtin(
        "shuffle",
        (_data("data"), Param("seed", "Int", "0", "the order's seed", keyword_only=True)),
        "Dataset",
        "The examples in a seeded random order (the same on every machine).",
        _OPS + "shuffle",
        examples=("let mixed = shuffle(chats, seed: 3)",),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "take",
        (_data("data"), Param("n", "Int", doc="how many examples, from the first")),
        "Dataset",
        "The first n examples (all of them when there are fewer).",
        _OPS + "take",
        examples=("let few = take(chats, 100)",),
        constraints=(Constraint("n >= 1", "n must be at least 1"),),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "split",
        (
            _data("data"),
            Param(
                "fraction",
                "Float",
                "0.1",
                "the part held out (at least one example)",
                keyword_only=True,
            ),
            Param("seed", "Int", "0", "which examples are held out", keyword_only=True),
        ),
        "Split",
        "A seeded random part of the examples held out for validation, the rest for "
        "training; each part keeps the file's order.",
        _OPS + "split",
        examples=(
            "let parts = split(chats, fraction: 0.1, seed: 1)\n"
            "print(train(lora(base), parts.train, validation: parts.held_out))",
        ),
        constraints=(
            Constraint("fraction > 0.0 and fraction < 1.0", "fraction must be in (0, 1)"),
        ),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "pack",
        (_data("data"),),
        "Dataset",
        "Several examples per context window: fewer padding tokens, the same loss. Position "
        "ids restart at each example and attention stays inside it.",
        _OPS + "pack",
        examples=("let packed = pack(chats)",),
        native=True,
        requires=("torch",),
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "inspect",
        (
            _data("data"),
            Param("model", "Model", doc="whose tokenizer and chat template to use"),
            Param("n", "Int", "1", "how many rows to show", keyword_only=True),
        ),
        "String",
        "What the model will be trained on: the first n rows as text with the scored part "
        "between ⟦ ⟧, and their token ids, unscored ones in parentheses.",
        _OPS + "inspect",
        examples=("print(inspect(chats, base, n: 2))",),
        constraints=(Constraint("n >= 1", "n must be at least 1"),),
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    ),
)

DECLARATIONS = Declarations(
    builtins=_BUILTINS,
    enums=(DATA_FORMAT, LOSS_ON, TOO_LONG),
    types=(DATASET, SPLIT),
)
