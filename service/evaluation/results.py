"""Per-example results and what they add up to: the rows a validation point or an evaluation stores
for each scenario, and the summary an operator reads (pass rate, failure table, lengths, tokens)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import art
from openai.types.chat.chat_completion import Choice

from environments.base import Environment

MAX_COMPLETION_CHARS = 4000  # what a stored row keeps of a completion
FAILURE_EXAMPLES = 3  # scenario ids listed per failure outcome


def outcome_of(env: Environment, trajectory: art.Trajectory) -> str:
    """The scorer's outcome code, or correct/incorrect for an environment that sets none."""
    outcome = trajectory.metadata.get("outcome")
    if isinstance(outcome, str):
        return outcome
    return "correct" if env.is_correct(trajectory) else "incorrect"


def _assistant_turns(trajectory: art.Trajectory) -> list[Any]:
    return [
        item
        for item in trajectory.messages_and_choices
        if isinstance(item, Choice) or (isinstance(item, dict) and item.get("role") == "assistant")
    ]


def completion_text(trajectory: art.Trajectory) -> str:
    """The last assistant turn as text, tool calls written ``name(arguments)``: what a reader checks."""
    turns = _assistant_turns(trajectory)
    if not turns:
        return ""
    last = turns[-1]
    message = last.message.model_dump() if isinstance(last, Choice) else last
    calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in message.get("tool_calls") or []]
    return "\n".join([message.get("content") or "", *calls]).strip()[:MAX_COMPLETION_CHARS]


def completion_tokens(trajectory: art.Trajectory) -> int | None:
    """Tokens the policy generated over the whole rollout, from the logprobs the backend returned; None when
    a turn came back without them (the count would be short)."""
    turns = [t for t in _assistant_turns(trajectory) if isinstance(t, Choice)]
    if not turns or any(t.logprobs is None or t.logprobs.content is None for t in turns):
        return None
    return sum(len(t.logprobs.content) for t in turns)


def sum_logprob(trajectory: art.Trajectory) -> float | None:
    """Summed logprob of every generated token (best-of-N's first tie-break); None without logprobs."""
    turns = [t for t in _assistant_turns(trajectory) if isinstance(t, Choice)]
    if not turns or any(t.logprobs is None or t.logprobs.content is None for t in turns):
        return None
    return sum(token.logprob for t in turns for token in t.logprobs.content)


def example_row(env: Environment, trajectory: art.Trajectory, *, position: int, scenario_id: str) -> dict[str, Any]:
    """A stored per-example result of one sampled rollout."""
    return {
        "position": position,
        "scenario_id": scenario_id,
        "outcome": outcome_of(env, trajectory),
        "correct": bool(env.is_correct(trajectory)),
        "reward": float(trajectory.reward) if math.isfinite(trajectory.reward) else 0.0,
        "completion": completion_text(trajectory),
        "completion_tokens": completion_tokens(trajectory),
        "details": json.loads(json.dumps({"metrics": trajectory.metrics, "metadata": trajectory.metadata}, default=str)),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pass rate, mean reward, the failure table by outcome code, mean completion length and tokens."""
    count = len(rows)
    if count == 0:
        return {"examples": 0, "pass_rate": None, "mean_reward": None, "failures": [], "outcomes": {},
                "mean_completion_chars": None, "mean_completion_tokens": None, "completion_tokens": None}  # fmt: skip
    outcomes = Counter(r["outcome"] for r in rows)
    failed = [r for r in rows if not r["correct"]]
    table = []
    for outcome, n in Counter(r["outcome"] for r in failed).most_common():
        ids = [r["scenario_id"] for r in failed if r["outcome"] == outcome][:FAILURE_EXAMPLES]
        table.append({"outcome": outcome, "count": n, "share": n / count, "examples": ids})
    tokens = [r["completion_tokens"] for r in rows]
    counted = None if any(t is None for t in tokens) else sum(tokens)
    return {
        "examples": count,
        "pass_rate": sum(r["correct"] for r in rows) / count,
        "mean_reward": sum(r["reward"] for r in rows) / count,
        "outcomes": dict(sorted(outcomes.items())),
        "failures": table,
        "mean_completion_chars": sum(len(r["completion"]) for r in rows) / count,
        "mean_completion_tokens": None if counted is None else counted / count,
        "completion_tokens": counted,
    }
