"""A grader as a job's training reward: each trajectory's final reply graded against its scenario.

A judge like RulerJudge (``judge(group) -> GroupJudgement``, judges/judgement.py), so the training loop treats
both alike. A group with a trajectory the grader could not grade (details carry "error": a timeout, a failed
model call) is dropped from the step with the reason, as a group RULER could not score is: a 0.0 that means
"not graded" must not train the policy as if it were a bad answer. A reply longer than MAX_REPLY_CHARS is not
graded either: the graders' work grows with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import art

from judges.graders import Grader, GradeResult, sample_from_text
from judges.groups import rescore
from judges.judgement import GroupJudgement
from judges.usage import JudgeUsage

MAX_REPLY_CHARS = 50_000  # graded at most: parsing, rendering and the metrics all grow with the reply


def final_reply(trajectory: art.Trajectory) -> str:
    """The content of the trajectory's last assistant message ("" when it ended in a tool call)."""
    for message in reversed(trajectory.messages()):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def usage_in(details: Any) -> JudgeUsage:
    """The model calls a grade made (score_model parts, however deeply nested in a multi grader)."""
    usage = JudgeUsage()
    if isinstance(details, Mapping):
        if "model" in details and "prompt_tokens" in details:
            usage.responses += 1
            usage.prompt_tokens += int(details.get("prompt_tokens") or 0)
            usage.completion_tokens += int(details.get("completion_tokens") or 0)
            if details.get("cost_usd") is None:
                usage.unpriced += 1
            else:
                usage.cost_usd += float(details["cost_usd"])
        for value in details.values():
            usage.add(usage_in(value))
    return usage


class GraderJudge:
    """Grades trajectory groups of one job with ``grader``, at most ``concurrency`` grades at once."""

    def __init__(self, grader: Grader, scenarios: Mapping[str, dict], *, concurrency: int) -> None:
        self.grader = grader
        self.scenarios = scenarios
        self._slots = asyncio.Semaphore(concurrency)

    async def _grade(self, trajectory: art.Trajectory, scenario: dict) -> GradeResult:
        reply = final_reply(trajectory)
        if len(reply) > MAX_REPLY_CHARS:
            return self.grader.error(f"the reply has {len(reply)} characters, more than the limit of {MAX_REPLY_CHARS}")
        async with self._slots:
            return await self.grader.grade(sample_from_text(reply), scenario)

    async def judge(self, group: art.TrajectoryGroup) -> GroupJudgement:
        scenario_id = str(group.metadata.get("scenario_id"))
        if (scenario := self.scenarios.get(scenario_id)) is None:
            return GroupJudgement(None, 0, JudgeUsage(), failure=f"no scenario {scenario_id!r} to grade against")
        results = await asyncio.gather(*(self._grade(t, scenario) for t in group.trajectories))
        usage = JudgeUsage()
        for result in results:
            usage.add(usage_in(result.details))
        errors = [result.details["error"] for result in results if "error" in result.details]
        if errors:
            failure = f"{self.grader.name} could not grade {len(errors)} of {len(results)} replies: {errors[0]}"
            return GroupJudgement(None, len(results), usage, failure=failure)
        graded = rescore(
            group,
            [r.reward for r in results],
            metrics=[{"grader_reward": r.reward} for r in results],
            logs=[f"{self.grader.name} {r.reward:.3f}: {r.details.get('reason', '')}"[:500] for r in results],
        )
        return GroupJudgement(graded, len(results), usage)
