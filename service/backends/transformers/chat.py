"""Conversations to tokens and replies to OpenAI messages, through the model's own chat template.

One tokenizer object renders the prompts the server samples from and the conversations ART's ``tokenize`` turns
into training rows, so the two can never disagree. Tool calls follow the Hermes convention that vLLM's ``hermes``
parser reads: the tools are listed in the system turn inside ``<tools></tools>`` and the model writes each call as

    <tool_call>
    {"name": "search_inbox", "arguments": {"keywords": ["budget"]}}
    </tool_call>

A ChatML template that renders no tools of its own (SmolLM2's) gets this convention added for requests that carry
tools; without tools it renders exactly as before. As in Qwen2.5's template, a reply that is only calls renders as
``<|im_start|>assistant\n<tool_call>...``: the text a policy writes for it, so the next turn's prompt holds the
policy's earlier replies token for token, as its training row does. A call whose JSON is broken is still returned
as a tool call, its arguments the raw text, so that the environment answers it as a tool error the policy can learn
from, as a wrong argument would be.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass
from typing import Any

from openai.types.chat import ChatCompletionToolParam
from pydantic import TypeAdapter

from service.backends.transformers import structured

# each tokenizer's end tokens, as end_token_ids found them
_END_TOKENS: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()

_HERMES_CHATML = r"""{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '\n\n' }}
{%- else %}{{- '<|im_start|>system\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" + (tool | tojson) }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls or [] %}{%- set call = tool_call.function or tool_call %}
{{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""

# ART's ``art.types.Tools``, named here so that the inference process, which serves base models and never trains,
# does not import ART for it (about 2 s of CPU a process start: litellm and ART's own modules)
TOOLS = list[ChatCompletionToolParam]
_TRAJECTORY_TOOLS = TypeAdapter(TOOLS)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{0,64})"')


def add_tool_support(tokenizer: Any) -> None:
    """Give a ChatML template without tool rendering the Hermes convention, for requests with tools."""
    template = tokenizer.chat_template
    if not isinstance(template, str) or "tools" in template or "<|im_start|>" not in template:
        return
    tokenizer.chat_template = "{%- if tools %}" + _HERMES_CHATML + "{%- else %}" + template + "{%- endif %}"


def end_token_ids(tokenizer: Any) -> set[int]:
    """The tokens that end a reply: the tokenizer's end of sequence and the end-of-turn markers of common templates.

    Looked up once per tokenizer: ``get_vocab()`` (and ``len``) build the whole vocabulary anew at each call, 9-22 ms
    for SmolLM2's 49,152 entries, and every request renders its assistant turns through this
    (:func:`reply_token_ids`): in the main job that was half of the event loop's time, holding the GIL the model
    thread needs between its products."""
    if (held := _END_TOKENS.get(tokenizer)) is None:
        vocab = tokenizer.get_vocab()
        found = {tokenizer.eos_token_id, *(vocab.get(token) for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"))}
        held = _END_TOKENS[tokenizer] = frozenset(i for i in found if i is not None)
    return set(held)


def renders_tools(tokenizer: Any) -> bool:
    return isinstance(tokenizer.chat_template, str) and "tools" in tokenizer.chat_template


def tools_as_trained(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``tools`` as an ``art.Trajectory`` holds them, which is how ART renders them into a training row: its
    validation puts each tool's keys in the OpenAI type's order and drops keys that type lacks. A prompt sampled
    from the tools as sent would list them otherwise, and the row would train on a system turn never sampled from.
    Raises pydantic's ValidationError for tools that are not OpenAI tools."""
    return _TRAJECTORY_TOOLS.validate_python(tools) if tools else None


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt's token ids, ending with the assistant turn's opening."""
    return _rendered_ids(tokenizer, messages, tools, add_generation_prompt=True)


def _rendered_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                  add_generation_prompt: bool) -> list[int]:  # fmt: skip
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
                                        tokenize=True)  # fmt: skip
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding, or the ids


def tool_call_grammar(
    tool_choice: Any, tools: list[dict[str, Any]] | None, parallel_tool_calls: bool | None = None
) -> str | None:
    """The grammar ``tool_choice`` holds a reply to, in this convention: each call as the template renders it after
    the assistant turn's opening (``<tool_call>\n{"name": ...}\n</tool_call>``, calls joined by a newline), so a
    held reply reads back token for token in the next prompt. StructureError for a choice that cannot be held."""
    return structured.tool_call_grammar(tool_choice, tools, call_open="<tool_call>\n", call_close="\n</tool_call>",
                                        joiner="\n", parallel_tool_calls=parallel_tool_calls)  # fmt: skip


def reply_token_ids(tokenizer: Any, message: dict[str, Any], tools: list[dict[str, Any]] | None) -> list[int]:
    """The tokens a policy writes for the assistant ``message``, its end-of-turn token included: its turn as the
    template renders it, each call's arguments as :func:`parse_tool_calls` gives them back (:func:`_json_text`), so a
    policy that learns to write them sees its calls in the next turn's prompt exactly as it wrote them."""
    calls = [{**call, "function": {**call["function"], "arguments": _as_parsed(call["function"]["arguments"])}}
             for call in message.get("tool_calls") or []]  # fmt: skip
    opening = [{"role": "user", "content": "?"}]
    prompt = render_prompt(tokenizer, opening, tools)
    conversation = [*opening, {**message, "tool_calls": calls}]
    whole = _rendered_ids(tokenizer, conversation, tools, add_generation_prompt=False)
    ends = end_token_ids(tokenizer)
    reply = whole[len(prompt):]
    if whole[: len(prompt)] != prompt or not any(token in ends for token in reply):
        raise ValueError("this chat template does not render a reply as a continuation of its prompt")
    return reply[: next(i for i, token in enumerate(reply) if token in ends) + 1]


def _as_parsed(arguments: Any) -> str:
    """A call's arguments as the JSON text a parsed reply carries; text that is not a JSON object stays as it is."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
        return _json_text(value) if isinstance(value, dict) else arguments
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser recurses into
        return arguments


def _json_text(value: Any) -> str:
    """``value`` as JSON with its characters as a model writes them (``é``, not ``\\u00e9``), so a parsed reply renders
    back as its text; escaped only where a lone surrogate (``"\\ud800"`` in a reply) could not be encoded as UTF-8."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # text outside the calls; None when there is none
    tool_calls: list[dict[str, Any]]  # OpenAI ``tool_calls`` entries


def parse_tool_calls(text: str, *, call_id_prefix: str) -> ParsedReply:
    """Split a reply into content and Hermes tool calls; a reply without a complete call is all content."""
    calls = list(_CALL.finditer(text))
    if not calls:
        return ParsedReply(content=text, tool_calls=[])
    tool_calls = []
    for i, match in enumerate(calls):
        name, arguments = _call_parts(match.group(1))
        tool_calls.append({"id": f"{call_id_prefix}_{i}", "type": "function", "function": {"name": name, "arguments": arguments}})
    content = _CALL.sub("", text).strip()
    return ParsedReply(content=content or None, tool_calls=tool_calls)


def _call_parts(body: str) -> tuple[str, str]:
    """The call's name and its arguments as a JSON string; broken JSON keeps its text for the tool to refuse."""
    try:
        call = json.loads(body)
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            return call["name"], arguments if isinstance(arguments, str) else _json_text(arguments)
    except (ValueError, RecursionError):  # broken, or nested past what the parser recurses into
        pass
    found = _NAME.search(body)
    return (found.group(1) if found else ""), body
