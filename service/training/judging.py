"""Judged rewards inside a training step: RULER rescoring each group as its rollouts finish, and the
account of what that cost and how it went (a StepJudge, stored with the step, read by the alert rules). The job's
judge budget admits and charges every judge call (judges/usage.py).

The judge's endpoint, key and limits are the operator's (Settings); a job only names an allowed model.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import art
import polars as pl

from judges.graders import GraderConfigError, build_grader
from judges.grading import GraderJudge
from judges.judgement import RETRY_KINDS, GroupJudgement
from judges.ruler import JudgeConfig, RulerJudge
from judges.usage import BudgetSpent, JudgeBudget, JudgeUsage
from service.settings import Settings
from service.spec import RewardSpec
from service.store.records import StepJudge


class JudgeNotAllowed(ValueError):
    """The job names a judge the operator has not allowed (the API refuses it; a worker fails the job)."""


class BudgetedGrader:
    """A grader judge held to the job's budget: the grader's calls for one group are admitted together, before the
    group is graded, and charged together."""

    def __init__(self, grader: GraderJudge, budget: JudgeBudget) -> None:
        self.grader = grader
        self.budget = budget

    async def judge(self, group: art.TrajectoryGroup) -> GroupJudgement:
        usage = JudgeUsage()
        try:
            async with self.budget.admitted(usage):
                result = await self.grader.judge(group)
                usage.add(result.usage)
        except BudgetSpent as exc:
            return GroupJudgement(None, 0, JudgeUsage(), failure=str(exc))
        return result


Judge = RulerJudge | BudgetedGrader


def judge_for(
    reward: RewardSpec, settings: Settings, scenarios: Mapping[str, dict], budget: JudgeBudget
) -> Judge | None:
    """The job's judge under the operator's settings and ``budget``: RULER, or its grader (graded against
    ``scenarios``, the training split by id); None in verifier mode. Raises JudgeNotAllowed for a judge model or
    code grader the operator does not allow.

    Submission checked the reward (service/submission.py); what is checked again here is only what depends on the
    settings, which may have changed since, or differ on this worker: the judge model allowed, and for a grader,
    checked as it is built, the models and functions allowed."""
    if reward.mode == "verifier":
        return None
    key = settings.judge_api_key.get_secret_value() if settings.judge_api_key else None
    if reward.mode == "grader":
        assert reward.grader is not None  # the spec requires it in grader mode
        endpoint = {"api_base": settings.judge_api_base, "api_key": key, "timeout": settings.judge_timeout_s}
        try:
            grader = build_grader(reward.grader, allowed_models=set(settings.judge_models), code=settings.code_graders(),
                                  litellm_params={k: v for k, v in endpoint.items() if v is not None})  # fmt: skip
        except GraderConfigError as exc:
            raise JudgeNotAllowed(f"reward.grader: {exc}") from None
        return BudgetedGrader(GraderJudge(grader, scenarios, concurrency=settings.judge_concurrency), budget)
    assert reward.judge_model is not None  # the spec requires it in judged modes
    if (refusal := settings.refuse_judge(reward.judge_model)) is not None:
        raise JudgeNotAllowed(refusal)
    return RulerJudge(
        JudgeConfig(
            model=reward.judge_model,
            rubric=reward.rubric,
            api_base=settings.judge_api_base,
            api_key=key,
            timeout_s=settings.judge_timeout_s,
            max_retries=settings.judge_max_retries,
            backoff_s=settings.judge_backoff_s,
            concurrency=settings.judge_concurrency,
            exact_verdicts=settings.judge_exact_verdicts,
        ),
        budget=budget,
    )


def rank_agreement(group: art.TrajectoryGroup) -> float | None:
    """Spearman correlation of the judged rewards with the trajectories' own; None when either is constant."""
    ruler = [t.reward for t in group.trajectories]
    own = [t.metrics["independent_reward"] for t in group.trajectories]
    if len(set(ruler)) < 2 or len(set(own)) < 2:
        return None
    frame = pl.DataFrame({"ruler": ruler, "own": own}, schema={"ruler": pl.Float64, "own": pl.Float64})
    value = frame.select(pl.corr("ruler", "own", method="spearman")).item()
    return float(value) if value is not None and math.isfinite(value) else None


@dataclass
class StepJudging:
    """Judges one step's groups as gather_trajectory_groups finishes them (``after_each``) and keeps the
    account. A group the judge could not score is dropped from the step; the others go on."""

    judge: Judge
    usage: JudgeUsage = field(default_factory=JudgeUsage)
    judged: int = 0
    dropped: int = 0
    attempts: int = 0
    clamped: int = 0
    failures: list[str] = field(default_factory=list)
    retries: Counter[str] = field(default_factory=Counter)  # judge calls tried again, by kind
    agreements: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time with at least one judge call in flight (calls overlap, so not their sum)
    _in_flight: int = 0
    _busy_since: float = 0.0

    async def after_each(self, group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
        self._in_flight += 1
        try:
            result: GroupJudgement = await self.judge.judge(group)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.seconds += time.monotonic() - self._busy_since
        self.usage.add(result.usage)
        self.attempts += result.attempts
        self.clamped += len(result.clamped)
        self.retries.update(retry.kind for retry in result.retried)
        if result.group is None:
            self.dropped += 1
            self.failures.append(result.failure or "unknown")
            return None
        self.judged += 1
        if (agreement := rank_agreement(result.group)) is not None:
            self.agreements.append(agreement)
        return result.group

    def account(self) -> StepJudge:
        """The step's judge account, as its metrics keep it."""
        return StepJudge(
            **self.usage.as_metrics(),
            judge_groups=float(self.judged + self.dropped),
            judge_dropped_groups=float(self.dropped),
            judge_attempts=float(self.attempts),
            judge_clamped_scores=float(self.clamped),
            **{f"judge_retries_{kind}": float(self.retries[kind]) for kind in RETRY_KINDS},
            judge_agreement=sum(self.agreements) / len(self.agreements) if self.agreements else None,
        )
