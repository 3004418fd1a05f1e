"""Chat templates as Jinja source: the ``{% generation %}`` tag Aner understands and the syntax
check a template gets where a script gives one (`load_model(chat_template:)`), before a run and
when the call runs alike. Only jinja2 is imported here (no model library), so the checks before a
run use it too; rendering is the tokenizer's (`aner_lang.runtime.model.tokenizer`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aner_lang.problems.errors import AnerRuntimeError


@cache
def generation_tag() -> type:
    """The jinja2 extension for ``{% generation %}...{% endgeneration %}``: it renders its body
    and records the body's character span in the output, as HF transformers' AssistantTracker
    does (the environment's ``aner_generation`` holds the chunks so far and the spans)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2 reads it as a class attribute)

        def parse(self, parser: Any) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_generation")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation(self, caller: Any) -> str:
            text = caller()
            rendered, spans = self.environment.aner_generation  # type: ignore[attr-defined]
            start = sum(len(chunk) for chunk in rendered)
            spans.append((start, start + len(text)))
            return str(text)

    return GenerationTag


def extensions() -> list[Any]:
    """The jinja2 extensions a chat template may use: loop controls and ``{% generation %}``."""
    from jinja2.ext import loopcontrols

    return [loopcontrols, generation_tag()]


def syntax_error(template: str, what: str = "chat_template") -> AnerRuntimeError | None:
    """Why `template` is not a Jinja chat template Aner can render (its first syntax error, with
    the line inside the template), or None. `what` names the template in the message."""
    from jinja2 import Environment, TemplateSyntaxError

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=extensions())
    try:
        env.parse(template)
    except TemplateSyntaxError as exc:
        return AnerRuntimeError(
            f"{what} is not a Jinja template: line {exc.lineno} of the template: {exc.message}",
            code="E-CHAT-TEMPLATE",
            notes=(
                "a chat template is Jinja as Hugging Face transformers renders it "
                "(messages, add_generation_prompt, bos_token, eos_token)",
            ),
        )
    return None
