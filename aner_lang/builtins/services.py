"""Declarations of model services: `connect` to an OpenAI-compatible server, and `generate`,
`chat` and `evaluate` on the `Service` it returns (the same parameters as for a local `Model`,
declared once in `builtins.model`). Implementations live in `aner_lang.runtime.services`; they
need no native package, so a script that only uses services runs without torch."""

from __future__ import annotations

from dataclasses import replace

from aner_lang.builtins.model import overloads_for
from aner_lang.builtins.spec import Builtin, Constraint, Declarations, Field, Param, TypeDecl

_CATEGORY = "services"
_RT = "aner_lang.runtime.services."

SERVICE = TypeDecl(
    "Service",
    "A model on a server that speaks the OpenAI API (/v1/models, /v1/completions, "
    "/v1/chat/completions); Aner's tests run it against llama.cpp's server only.",
    fields=(
        Field("url", "String", "the server's base address"),
        Field("model", "String", "the model name sent with every request"),
    ),
    category=_CATEGORY,
)

_ON_SERVICE = {
    "generate": (
        _RT + "service:generate_builtin",
        " On a Service: POST /v1/completions (stop_at_eos: false needs a server that knows "
        "llama.cpp's ignore_eos).",
    ),
    "chat": (
        _RT + "service:chat_builtin",
        " On a Service: POST /v1/chat/completions; the server applies its chat template.",
    ),
    "evaluate": (
        _RT + "scoring:evaluate_builtin",
        " On a Service: from the log-probabilities llama.cpp's server gives the scored tokens "
        "(one request a text, batch_size unused); other servers fail with E-SERVICE-LOGPROBS.",
    ),
}

_OVERLOADS = tuple(
    replace(
        b,
        impl=_ON_SERVICE[b.name][0],
        doc=b.doc + _ON_SERVICE[b.name][1],
        native=False,
        requires=(),
        category=_CATEGORY,
    )
    for b in overloads_for("Service")
    if b.name in _ON_SERVICE
)

DECLARATIONS = Declarations(
    builtins=(
        Builtin(
            "connect",
            (
                Param("url", "String", doc='the server, e.g. "http://127.0.0.1:8080"'),
                Param(
                    "model",
                    "String?",
                    "none",
                    "the model to use; none: the first one the server lists",
                    keyword_only=True,
                ),
                Param(
                    "api_key_env",
                    "String?",
                    "none",
                    "the environment variable holding the API key (the key itself never "
                    "appears in a script, a message or a log)",
                    keyword_only=True,
                ),
                Param(
                    "timeout", "Float", "60.0", "seconds to wait for each answer", keyword_only=True
                ),
                Param(
                    "retries",
                    "Int",
                    "2",
                    "extra attempts after a timeout, a refused connection, a 429 or a 5xx, "
                    "waiting 0.5 s, 1 s, 2 s, ... between them",
                    keyword_only=True,
                ),
            ),
            "Service",
            "A model served over HTTP by an OpenAI-compatible server, usable like a local model "
            "with generate, chat and (llama.cpp's server) evaluate. The server is asked for its "
            "models now, so a wrong address or key fails here.",
            _RT + "service:connect_builtin",
            examples=(
                'let llm = connect("http://127.0.0.1:8080")\n'
                'print(generate(llm, "The capital of France is", max_tokens: 8))',
            ),
            constraints=(
                Constraint("timeout > 0.0", "timeout must be positive"),
                Constraint("retries >= 0", "retries must not be negative"),
            ),
            category=_CATEGORY,
        ),
        *_OVERLOADS,
    ),
    types=(SERVICE,),
)
