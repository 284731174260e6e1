"""The text convention by which the embedded policy calls tools, and its OpenAI form.

A small open model has no function-calling head: it writes text, and the server that hosts it
parses that text into OpenAI ``tool_calls`` (vLLM's ``--tool-call-parser`` does the same for
Hermes, Mistral and Llama formats). The embedded policy writes each call as::

    <tool_call>NAME ARGUMENTS</tool_call>

NAME is the function name and ARGUMENTS the JSON arguments, passed on as written: like an
OpenAI model's ``arguments`` string they may be malformed, and the environment answers that as a
tool error. Text before the first call is the message's content. A call cut off before its
closing tag is not a call; it stays in the content. The same convention renders tool calls of
earlier assistant turns back into the prompt, so a turn reads as the policy wrote it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>([A-Za-z_][A-Za-z0-9_.-]{0,63})(?: ?)(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # text before the first call; None when a call comes first
    tool_calls: list[dict[str, Any]]  # OpenAI ``tool_calls`` entries


def parse(text: str, *, call_id_prefix: str) -> ParsedReply:
    """Split a reply into content and tool calls; a reply without complete calls is all content."""
    calls = list(_CALL.finditer(text))
    if not calls:
        return ParsedReply(content=text, tool_calls=[])
    tool_calls = [
        {"id": f"{call_id_prefix}_{i}", "type": "function", "function": {"name": m.group(1), "arguments": m.group(2)}}
        for i, m in enumerate(calls)
    ]
    return ParsedReply(content=text[: calls[0].start()] or None, tool_calls=tool_calls)


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def render(content: str, tool_calls: Any) -> str:
    """An assistant turn as the policy would have written it: content, then each call."""
    text = content
    for call in tool_calls if isinstance(tool_calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        arguments = _arguments_text(function.get("arguments", ""))
        text += f"{OPEN}{function.get('name', '')}{' ' if arguments else ''}{arguments}{CLOSE}"
    return text
