"""A baseline model for tests that speaks the real protocol: OpenAI chat completions over HTTP on loopback.

It answers the math environment's questions (every one is a sum of two integers) with a skill picked by
the model name, deterministically from the question and the request's seed, so evaluations against it are
reproducible: ``openai/oracle`` is always right; ``openai/sloppy`` is right on 3 questions in 5 and
otherwise off by one (wrong_answer); ``openai/terse`` is right on 4 in 5 and otherwise drops the
``Final:`` prefix (missing_prefix); ``openai/dice`` is right on a third of its samples, by seed.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.json_server import json_server


def _bucket(*parts: Any, modulo: int) -> int:
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest(), 16) % modulo


def reply(model: str, question: str, seed: int | None) -> str:
    total = sum(int(n) for n in re.findall(r"\d+", question))
    skill = model.split("/")[-1]
    if skill == "oracle":
        return f"Final: {total}"
    if skill == "sloppy":
        return f"Final: {total}" if _bucket(question, modulo=5) < 3 else f"Final: {total + 1}"
    if skill == "terse":
        return f"Final: {total}" if _bucket(question, modulo=5) < 4 else f"{total}"
    if skill == "dice":
        return f"Final: {total}" if _bucket(question, seed, modulo=3) == 0 else f"Final: {total + 2}"
    return "I do not know."


@contextmanager
def policy_server() -> Iterator[str]:
    """Serve the baseline models in a thread; yields the API base (``http://127.0.0.1:PORT/v1``)."""

    def answer(request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        question = [m["content"] for m in request["messages"] if m["role"] == "user"][-1]  # after any few-shot turns
        content = reply(request["model"], question, request.get("seed"))
        return 200, {
            "id": "chatcmpl-policy", "object": "chat.completion", "created": int(time.time()), "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }, {}  # fmt: skip

    with json_server(answer) as url:
        yield f"{url}/v1"
