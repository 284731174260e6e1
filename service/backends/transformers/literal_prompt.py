"""Prompts in which the caller's text stays text: ``hi<|im_end|>\\n<|im_start|>system\\n...`` written in a message is
tokenized as those characters, never as the template's control tokens, so a user cannot forge a turn (vLLM's
reading of chat content). The template's own control tokens stay what they are.

How: every caller-written string (a message's ``content`` and ``name``, a tool call's ``name`` and ``arguments``)
is rendered as a unique mark, the rendered text is cut at the marks, and the template's pieces are tokenized with
special tokens on, the caller's strings with them off. A template that does more with a string than paste it (trims
it, branches on it) renders differently with marks; such a prompt is rendered the ordinary way, and refused if any
caller string holds a control token.

Only the API's serving path uses this: ART tokenizes training conversations with control tokens on, and the policy
server's prompts must be what ART rebuilds (service/backends/transformers/chat.py).
"""

from __future__ import annotations

import re
from typing import Any

from service.backends.transformers import chat

_MARK = "\ue000{}\ue001"  # private-use characters: no template writes them
_MARKS = re.compile("\ue000(\\d+)\ue001")
_CALLER_KEYS = ("content", "name", "arguments")


class ControlTokenInText(ValueError):
    """A caller's string holds a control token and this template cannot keep it apart as text."""


def render_literal_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt's token ids as :func:`chat.render_prompt` renders them, the caller's strings tokenized as text;
    ControlTokenInText where the template cannot keep them apart and one holds a control token."""
    texts: list[str] = []
    marked = [_marked(message, texts) for message in messages]
    plain = _render_text(tokenizer, messages, tools)
    pieces = _MARKS.split(_render_text(tokenizer, marked, tools))
    templated = pieces[0::2]
    written = [texts[int(index)] for index in pieces[1::2]]
    if "".join(t + w for t, w in zip(templated, [*written, ""])) != plain:
        if any(token in text for text in texts for token in _control_tokens(tokenizer)):
            raise ControlTokenInText("a message holds one of the model's control tokens in a place its template "
                                     "cannot keep apart as text")  # fmt: skip
        return chat.render_prompt(tokenizer, messages, tools)
    ids: list[int] = []
    for template_text, caller_text in zip(templated, [*written, None]):
        ids += tokenizer.encode(template_text, add_special_tokens=False)
        if caller_text is not None:
            ids += tokenizer.encode(caller_text, add_special_tokens=False, split_special_tokens=True)
    return ids


def _marked(value: Any, texts: list[str]) -> Any:
    """``value`` with each caller string replaced by its mark (its index in ``texts``, where it is appended)."""
    if isinstance(value, list):
        return [_marked(item, texts) for item in value]
    if not isinstance(value, dict):
        return value
    marked = {}
    for key, item in value.items():
        if key in _CALLER_KEYS and isinstance(item, str) and item:
            texts.append(item)
            marked[key] = _MARK.format(len(texts) - 1)
        else:
            marked[key] = _marked(item, texts) if key in ("tool_calls", "function") else item
    return marked


def _render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


def _control_tokens(tokenizer: Any) -> list[str]:
    return [token.content for token in tokenizer.added_tokens_decoder.values() if token.special]
