"""What the operator dashboard's pages show, as plain values for its templates: sparklines, the failure table,
readable chats, the manifest and the cost account. Pure functions over store rows; the templates escape every
string they print (model output included), so nothing here marks text safe."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from service.store.tables import ExampleResult, SampledTrajectory, ValidationPoint

SPARK_W, SPARK_H, SPARK_PAD = 120, 28, 2
EXAMPLES_PER_OUTCOME = 3
MAX_SHOWN_CHARS = 4000  # a longer completion or message is cut, with a note saying so


@dataclass(frozen=True)
class Sparkline:
    """An inline SVG's polylines (``points`` attributes) of validation accuracy (on 0..1) and mean reward (on its
    own range), and the last values, for the jobs page."""

    val_points: str
    reward_points: str
    last_val: float | None
    last_reward: float | None
    reward_range: tuple[float, float] | None

    @property
    def empty(self) -> bool:
        return not (self.val_points or self.reward_points)


def _polyline(points: list[tuple[int, float]], *, low: float, high: float, steps: tuple[int, int]) -> str:
    if not points:
        return ""
    first, last = steps
    span_x, span_y = max(last - first, 1), (high - low) or 1.0
    inner_w, inner_h = SPARK_W - 2 * SPARK_PAD, SPARK_H - 2 * SPARK_PAD
    coords = [
        (SPARK_PAD + inner_w * (step - first) / span_x,
         SPARK_PAD + inner_h * (1 - (min(max(value, low), high) - low) / span_y) if high > low else SPARK_H / 2)
        for step, value in points
    ]  # fmt: skip
    if len(coords) == 1:  # one point: a short dash, so it shows
        x, y = coords[0]
        coords = [(max(x - 3, 0), y), (min(x + 3, SPARK_W), y)]
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)


def sparkline(series: dict[str, list[tuple[int, float]]]) -> Sparkline:
    """The sparkline of one job's ``val_accuracy`` and ``reward_mean`` series (service/store/dashboard.py)."""
    val, reward = series.get("val_accuracy", []), series.get("reward_mean", [])
    every = [step for step, _ in val + reward]
    steps = (min(every), max(every)) if every else (0, 1)
    rewards = [value for _, value in reward]
    reward_range = (min(rewards), max(rewards)) if rewards else None
    return Sparkline(
        val_points=_polyline(val, low=0.0, high=1.0, steps=steps),
        reward_points=_polyline(reward, low=reward_range[0], high=reward_range[1], steps=steps) if reward_range else "",
        last_val=val[-1][1] if val else None,
        last_reward=rewards[-1] if rewards else None,
        reward_range=reward_range,
    )


@dataclass
class OutcomeRow:
    outcome: str
    count: int
    share: float
    correct: bool
    examples: list[ExampleResult] = field(default_factory=list)


def failure_table(point: ValidationPoint | None, results: list[ExampleResult]) -> list[OutcomeRow]:
    """The outcome codes of a validation point with their counts, most frequent first, each failing code with up
    to three of its completions (from the point's per-example rows, when they were recorded)."""
    if point is None:
        return []
    counts = Counter({str(k): int(v) for k, v in point.outcomes.items()})
    for result in results:  # outcomes only the per-example rows name (an older point's breakdown may lack them)
        counts.setdefault(result.outcome, 0)
    total = sum(counts.values()) or 1
    rows = []
    for outcome, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        mine = [r for r in results if r.outcome == outcome]
        correct = any(r.correct for r in mine) if mine else outcome == "correct"
        shown = [] if correct else [r for r in mine if not r.correct][:EXAMPLES_PER_OUTCOME]
        rows.append(OutcomeRow(outcome=outcome, count=count, share=count / total, correct=correct, examples=shown))
    return rows


def clipped(text: str) -> str:
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return text[:MAX_SHOWN_CHARS] + f"\n… ({len(text) - MAX_SHOWN_CHARS} more characters)"


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: list[tuple[str, str]]  # (function name, arguments)
    note: str | None  # a tool reply's call id or name


def _content(value: Any) -> str:
    """OpenAI chat content: a string, a list of parts (text parts joined, others as JSON), or nothing."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text", "") if isinstance(p, dict) and p.get("type") == "text" else _json(p) for p in value]
        return "\n".join(parts)
    return _json(value)


def chat(trajectory: SampledTrajectory) -> list[ChatMessage]:
    """A sampled rollout's conversation as messages to read: role, text, tool calls."""
    messages = []
    for raw in trajectory.messages:
        if not isinstance(raw, dict):
            messages.append(ChatMessage(role="?", content=clipped(_json(raw)), tool_calls=[], note=None))
            continue
        calls = []
        for call in raw.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            calls.append((str(function.get("name", "?")), clipped(_content(function.get("arguments")))))
        note = raw.get("tool_call_id") or raw.get("name")
        messages.append(ChatMessage(role=str(raw.get("role", "?")), content=clipped(_content(raw.get("content"))),
                                    tool_calls=calls, note=None if note is None else str(note)))  # fmt: skip
    return messages


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def manifest_view(manifest: dict[str, Any] | None) -> tuple[list[tuple[str, str]], str] | None:
    """A manifest's ``locked`` fields as (name, value) rows and the rest as pretty JSON; None if not written yet."""
    if manifest is None:
        return None
    locked = manifest.get("locked") if isinstance(manifest.get("locked"), dict) else {}
    rows = [(str(k), v if isinstance(v, str) else _json(v)) for k, v in locked.items()]
    rest = {k: v for k, v in manifest.items() if k != "locked"}
    return rows, _json(rest)


def cost_rows(totals: dict[str, Any]) -> list[tuple[str, str]]:
    """``runs.cost_totals`` as labelled, formatted rows."""
    wall = totals.get("wall_s", {})
    rows = [
        ("policy tokens, training", f"{totals.get('tokens_generated_train', 0):,}"),
        ("policy tokens, validation", f"{totals.get('tokens_generated_validation', 0):,}"),
        ("judge prompt tokens", f"{totals.get('judge_prompt_tokens', 0):,}"),
        ("judge completion tokens", f"{totals.get('judge_completion_tokens', 0):,}"),
        ("judge cost", f"${float(totals.get('judge_cost_usd') or 0):.4f}"),
    ]
    rows += [(f"wall time, {phase}", f"{float(seconds or 0):.1f} s") for phase, seconds in wall.items()]
    return rows
