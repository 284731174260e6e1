"""A judge for tests that speaks the real protocol: OpenAI chat completions over HTTP on loopback.

It reads RULER's prompt the way a judge model would (the ``<trajectory id="N">`` blocks), answers in
the ``json_schema`` response format RULER asks for, reports token usage, and can be scripted to
misbehave: each request takes the next scripted behaviour, then the default one.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.json_server import json_server

TRAJECTORY = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.DOTALL)

Scorer = Callable[[str], float]  # a trajectory's serialised messages -> its score


def answers_something(text: str) -> float:
    """The default rubric: a trajectory that gave a final answer beats one that did not."""
    return 0.9 if "return_final_answer" in text or "Final:" in text else 0.1


@dataclass
class Behaviour:
    """How the judge answers one request. ``scores`` rewrites the parsed {id: score} before answering."""

    status: int = 200
    body: str | None = None  # the completion's content instead of a verdict
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    scores: Callable[[dict[str, float]], dict[str, float]] | None = None


@dataclass
class JudgeServer:
    url: str
    script: list[Behaviour]
    requests: list[dict[str, Any]]
    scorer: list[Scorer]
    in_flight: int = 0
    most_in_flight: int = 0  # the most requests it was answering at once

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"


def _verdict(request: dict[str, Any], scorer: Scorer, rewrite: Callable[[dict[str, float]], dict[str, float]] | None) -> str:
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    scores = {tid: scorer(text) for tid, text in TRAJECTORY.findall(user)}
    if rewrite is not None:
        scores = rewrite(scores)
    return json.dumps(
        {"scores": [{"trajectory_id": tid, "explanation": "judged by the test judge", "score": s} for tid, s in scores.items()]}
    )


def _completion(request: dict[str, Any], content: str) -> dict[str, Any]:
    """A chat completion carrying ``content``, with usage counted by litellm's tokenizer for the model."""
    import litellm

    model = request["model"]
    prompt_tokens = litellm.token_counter(model=model, messages=request["messages"])
    completion_tokens = litellm.token_counter(model=model, text=content, count_response_tokens=True)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }  # fmt: skip


@contextmanager
def judge_server(script: list[Behaviour] | None = None, scorer: Scorer = answers_something) -> Iterator[JudgeServer]:
    """Serve the judge in a thread; ``server.script`` may be appended to while it runs."""
    state = JudgeServer("", list(script or []), [], [scorer])
    lock = threading.Lock()

    def answer(request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with lock:
            state.requests.append(request)
            behaviour = state.script.pop(0) if state.script else Behaviour()
            state.in_flight += 1
            state.most_in_flight = max(state.most_in_flight, state.in_flight)
        time.sleep(behaviour.delay_s)
        with lock:
            state.in_flight -= 1
        if behaviour.status != 200:
            return behaviour.status, {"error": {"message": f"scripted {behaviour.status}", "type": "test"}}, behaviour.headers
        # a well-formed completion, carrying a verdict or the scripted (broken) content
        content = behaviour.body if behaviour.body is not None else _verdict(request, state.scorer[0], behaviour.scores)
        return 200, _completion(request, content), behaviour.headers

    with json_server(answer) as url:
        state.url = url
        yield state
