"""One email-search episode as a state machine, independent of any model.

The rollout (and the scripted agents) hand it each assistant turn: the tool calls as OpenAI
gives them, or nothing. It runs the calls through the tools, answers with the messages to
append, and counts what a trainer wants to know. Anything a policy can emit is an answer, not
an exception: broken or oversized arguments, unknown tools, a turn without a tool call (which
gets a user message saying so), calls after the final answer. Each such call counts as invalid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from environments.email.search import Index
from environments.email.tools import Session, toolbox
from environments.email.verifier import CORRECT, shaped_reward, verify

MAX_TURNS_LIMIT = 50
MAX_CALLS_PER_TURN = 4  # further calls in one turn are answered with an error, unrun
NO_TOOL_CALL = "error: call a tool"
TOO_MANY_CALLS = f"error: at most {MAX_CALLS_PER_TURN} calls a turn"
ALREADY_ANSWERED = "error: already answered"
EPISODE_OVER = "error: episode over"


def check_max_turns(max_turns: Any) -> int:
    if type(max_turns) is not int or not 1 <= max_turns <= MAX_TURNS_LIMIT:
        raise ValueError(f"max_turns must be an integer from 1 to {MAX_TURNS_LIMIT}, got {max_turns!r}")
    return max_turns


@dataclass(frozen=True)
class EpisodeResult:
    verdict: dict[str, Any]  # verify()'s result: the validation verdict
    reward: float  # shaped_reward(): the training reward
    metrics: dict[str, float | int | bool]

    @property
    def outcome(self) -> str:
        return self.verdict["details"]["outcome"]


def _unpack(call: Any, fallback_id: str) -> tuple[str, Any, Any]:
    """(id, name, arguments) of an OpenAI tool call given as an object or a dict; never raises."""
    try:
        if isinstance(call, Mapping):
            function = call.get("function")
            call_id = call.get("id")
            name = function.get("name") if isinstance(function, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
        else:
            function = getattr(call, "function", None)
            call_id = getattr(call, "id", None)
            name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
    except Exception:  # noqa: BLE001 - a hostile object is one more invalid call
        return fallback_id, None, None
    if not isinstance(call_id, str) or not call_id or len(call_id) > 64:
        call_id = fallback_id
    return call_id, name, arguments


class Episode:
    """An episode on ``scenario`` (a split row) lasting at most ``max_turns`` assistant turns."""

    def __init__(self, scenario: Mapping[str, Any], max_turns: int = 6, *, index: Index | None = None) -> None:
        self.max_turns = check_max_turns(max_turns)
        self.scenario = scenario
        inbox = scenario.get("inbox") if isinstance(scenario, Mapping) else None
        self.session = Session(inbox=inbox if isinstance(inbox, str) else "")
        self._tools = toolbox(self.session, index)
        self.turns = 0
        self.invalid_tool_calls = 0
        self.tool_calls_made = 0
        self._calls_seen = 0

    @property
    def done(self) -> bool:
        return self.session.final is not None or self.turns >= self.max_turns

    @property
    def ran_out_of_turns(self) -> bool:
        return self.session.final is None and self.turns >= self.max_turns

    def step(self, tool_calls: Iterable[Any] | None) -> list[dict[str, Any]]:
        """One assistant turn: :meth:`tool_calls` if it made any, else :meth:`no_tool_call`."""
        try:
            calls = list(tool_calls or [])
        except Exception:  # noqa: BLE001 - not iterable: treat as no call
            calls = []
        return self.tool_calls(calls) if calls else self.no_tool_call()

    def tool_calls(self, calls: Iterable[Any]) -> list[dict[str, Any]]:
        """Run one turn's tool calls; returns one tool message per call, in order."""
        try:
            calls = list(calls)
        except Exception:  # noqa: BLE001
            calls = []
        if not calls:
            return self.no_tool_call()
        over = self.done
        if not over:
            self.turns += 1
        replies = []
        for position, call in enumerate(calls):
            call_id, name, arguments = _unpack(call, f"call_{self._calls_seen}")
            self._calls_seen += 1
            if over:
                content = EPISODE_OVER  # not this episode's turn any more: answered, not counted
            elif self.session.final is not None:
                content, self.invalid_tool_calls = ALREADY_ANSWERED, self.invalid_tool_calls + 1
            elif position >= MAX_CALLS_PER_TURN:
                content, self.invalid_tool_calls = TOO_MANY_CALLS, self.invalid_tool_calls + 1
            else:
                result = self._tools.call(name, arguments)
                self.tool_calls_made += 1
                self.invalid_tool_calls += result.error is not None
                content = result.content
            replies.append({"role": "tool", "tool_call_id": call_id, "content": content})
        return replies

    def no_tool_call(self) -> list[dict[str, Any]]:
        """An assistant turn without a tool call: counted as invalid, answered as the user."""
        if self.done:
            return [{"role": "user", "content": EPISODE_OVER}]
        self.turns += 1
        self.invalid_tool_calls += 1
        return [{"role": "user", "content": NO_TOOL_CALL}]

    @property
    def final_answer(self) -> tuple[str, list[str]] | None:
        return self.session.final

    def result(self) -> EpisodeResult:
        """The verdict, the shaped reward and the metrics of the episode so far."""
        answer, cited = self.session.final if self.session.final is not None else (None, [])
        verdict = verify(self.scenario, answer, cited)
        correct = verdict["details"]["outcome"] == CORRECT
        try:
            sources = list(self.scenario.get("source_ids") or [])
        except Exception:  # noqa: BLE001
            sources = []
        reward = shaped_reward(
            correct=correct,
            sources=sources,
            cited=cited,
            read=self.session.read,
            invalid_tool_calls=self.invalid_tool_calls,
        )
        metrics: dict[str, float | int | bool] = {
            "correct": correct,
            "invalid_tool_calls": self.invalid_tool_calls,
            "turns": self.turns,
            "read_count": len(self.session.read),
            "tool_calls": self.tool_calls_made,
            "searches": self.session.searches,
            "sources_read": sum(s in self.session.read for s in sources if isinstance(s, str)),
            "answered": self.session.final is not None,
            "ran_out_of_turns": self.ran_out_of_turns,
        }
        return EpisodeResult(verdict=verdict, reward=reward, metrics=metrics)
