"""Conversations as training examples: rendered with the model's chat template, loss on the
assistant's turns, checked against HF transformers' assistant mask and against a hand-built
expectation on SmolLM2's own ChatML template."""

from __future__ import annotations

import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.tasks.chat import chat_tokens

CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome, of course!"},
]
MARKED = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
UNMARKED = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    from aner_lang.runtime.io.gguf import GGUFFile
    from aner_lang.runtime.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


def _with_template(tokenizer, template):
    from dataclasses import replace

    return replace(tokenizer, chat_template=template)


def test_assistant_mask_matches_transformers(smollm2_tokenizer):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=smollm2_tokenizer.backend)
    out = hf.apply_chat_template(
        CONVERSATION,
        chat_template=MARKED,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    expected_ids, expected_mask = list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    assert sum(expected_mask) > 0
    for template in (MARKED, UNMARKED):  # the template's own markers, and found by rendering
        ids, scored = chat_tokens(
            _with_template(smollm2_tokenizer, template), CONVERSATION, "responses", "x:1"
        )
        assert ids == expected_ids
        assert scored == expected_mask, template


def test_smollm2_template_scores_replies_and_their_end_token(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids, scored = chat_tokens(tok, CONVERSATION, "responses", "x:1")
    text = tok.apply_chat_template(CONVERSATION, add_generation_prompt=False)
    assert ids == tok.encode(text, add_special=False)
    replies = [tok.decode([i for i, s in zip(ids, scored) if s])]
    assert replies == ["Paris.<|im_end|>Rome, of course!<|im_end|>"]
    # each scored run is exactly a reply and its end-of-turn token
    runs, current = [], []
    for i, s in zip(ids, scored):
        if s:
            current.append(i)
        elif current:
            runs.append(tok.decode(current))
            current = []
    assert runs == ["Paris.<|im_end|>", "Rome, of course!<|im_end|>"]
    all_ids, all_scored = chat_tokens(tok, CONVERSATION, "all", "x:1")
    assert all_ids == ids and all(all_scored)


def test_a_template_that_rewrites_history_is_an_error(smollm2_tokenizer):
    # drops every assistant turn but the last: earlier renderings are not prefixes
    template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(AnerRuntimeError, match=r"chats.jsonl:7: the chat template") as info:
        chat_tokens(
            _with_template(smollm2_tokenizer, template), CONVERSATION, "responses", "chats.jsonl:7"
        )
    assert info.value.code == "E-DATA-ASSISTANT-SPANS"


def test_a_model_without_a_chat_template(smollm2_tokenizer):
    with pytest.raises(AnerRuntimeError, match="no chat template") as info:
        chat_tokens(_with_template(smollm2_tokenizer, None), CONVERSATION, "responses", "x:1")
    assert info.value.code == "E-CHAT-TEMPLATE"
