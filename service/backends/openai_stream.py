"""A chat completion as OpenAI's server-sent stream (``stream: true``): ``chat.completion.chunk`` events ending in
``data: [DONE]``, which the official client's ``stream=True`` reads.

The completion is sampled first, then streamed: each choice's whole message (role, content, tool calls, logprobs)
in one delta and its finish reason in the next, then the usage. A client that streams gets the answer in the shape it
expects, not earlier: the tokens are not sent as they are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def chunks(completion: dict[str, Any]) -> Iterator[str]:
    """The server-sent events of ``completion`` (a ``chat.completion`` body)."""
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}  # fmt: skip
    for choice in completion["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        yield _event(head | {"choices": [{"index": choice["index"], "delta": delta, "logprobs": choice.get("logprobs"),
                                          "finish_reason": None}]})  # fmt: skip
        yield _event(head | {"choices": [{"index": choice["index"], "delta": {}, "logprobs": None,
                                          "finish_reason": choice["finish_reason"]}]})  # fmt: skip
    if completion.get("usage") is not None:
        yield _event(head | {"choices": [], "usage": completion["usage"]})
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
