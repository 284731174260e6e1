"""One training step: roll out the step's groups (judging each as it finishes), train on them, record the step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import art
from openai.types.chat.chat_completion import Choice

from environments.base import Sampling
from judges.usage import BudgetSpent
from service.alerts import check_alerts
from service.evaluation.results import completion_tokens
from service.runner.seeding import batch_for_step, derive_seed
from service.store import runs
from service.store.records import StepCost, StepCreate, StepJudge, StepMetrics
from service.training.diagnostics import typed_diagnostics
from service.training.judging import StepJudging
from service.training.run import Run, sampled

ROLLOUT_FAILURE_TOLERANCE = 0.1  # fraction of a step's rollouts that may raise before the step fails
JUDGE_OUTAGE_ATTEMPTS = 3  # tries of a step whose every group the judge failed, before the job stops


class JudgeOutage(Exception):
    """The judge scored none of a step's groups, JUDGE_OUTAGE_ATTEMPTS times in a row."""


async def train_step(run: Run, step: int) -> int:
    """Roll out, (judge,) train and record one step. With a judge, a step whose every group the judge
    failed trains nothing and is tried again; the step that records counts every try's judging. A step
    that records nothing (the judge down, or the budget spent: JudgeOutage, BudgetSpent) keeps what its
    judging cost all the same."""
    judging = StepJudging(run.judge) if run.judge is not None else None
    for _ in range(JUDGE_OUTAGE_ATTEMPTS):
        started = time.monotonic()
        groups = await _rollouts(run, step, judging)
        if groups:
            gathered_s = time.monotonic() - started
            return await _train_and_record(run, groups, judging, started=started, gathered_s=gathered_s)
        assert judging is not None  # without a judge, gather raises rather than return no group
        if run.budget.spent:
            _record_judge_spend(run, step, judging)
            raise BudgetSpent(judging.failures[-1])
        run.on_event("judge_outage", {"step": step, "failures": judging.failures[-3:]})
    _record_judge_spend(run, step, judging)
    raise JudgeOutage(
        f"the judge scored none of step {step}'s groups in {JUDGE_OUTAGE_ATTEMPTS} tries; last: {judging.failures[-1]}"
    )


def _record_judge_spend(run: Run, step: int, judging: StepJudging) -> None:
    with run.write() as session:
        runs.record_judge_spend(session, job=runs.get_job(session, job_id=run.job_id), step=step, judge=judging.account())


async def _rollouts(run: Run, step: int, judging: StepJudging | None) -> list[art.TrajectoryGroup]:
    spec = run.spec
    scenarios = batch_for_step(run.env.scenarios("train"), seed=spec.seed, step=step, size=spec.training.groups_per_step)

    in_flight: set[asyncio.Task[art.Trajectory]] = set()  # so that a stop can cancel each rollout

    def started(rollout: Coroutine[Any, Any, art.Trajectory]) -> asyncio.Task[art.Trajectory]:
        task = asyncio.ensure_future(rollout)
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        return task

    def rollouts(scenario: dict) -> art.TrajectoryGroup:
        return art.TrajectoryGroup(
            (
                started(run.env.rollout(
                    run.model,
                    scenario,
                    Sampling(temperature=spec.training.temperature, seed=derive_seed(spec.seed, "train", step, scenario["id"], i)),
                ))
                for i in range(spec.training.group_size)
            ),
            metadata={"scenario_id": str(scenario["id"])},  # what a grader grades the group's replies against
        )

    total = spec.training.groups_per_step * spec.training.group_size
    gathered = art.gather_trajectory_groups(
        (rollouts(s) for s in scenarios),
        pbar_desc=None,
        max_exceptions=int(total * ROLLOUT_FAILURE_TOLERANCE),
        after_each=judging.after_each if judging is not None else None,
    )
    return await run.check_stop.guard(gathered, parts=in_flight)  # a cancel or a stop drops the rollouts in flight


def step_values(
    groups: list[art.TrajectoryGroup], reported: dict[str, float], *, cost: StepCost, wall_time_s: float,
    judge: StepJudge | None = None,
) -> StepCreate:  # fmt: skip
    """What the store records of a step trained on ``groups`` whose backend reported ``reported`` (the tokens the
    policy generated are counted here, into ``cost``)."""
    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories]
    mean = sum(rewards) / len(rewards)
    cost = cost.model_copy(update={"tokens_generated": float(sum(completion_tokens(t) or 0 for t in trajectories))})
    return StepCreate(
        reward_mean=mean,
        reward_std=(sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        groups=len(groups),
        zero_variance_groups=int(reported.get("zero_variance_groups", 0)),
        **typed_diagnostics(reported),
        completion_length=sum(map(_completion_chars, trajectories)) / len(trajectories),
        wall_time_s=wall_time_s,
        metrics=StepMetrics(
            backend={k: float(v) for k, v in reported.items()},
            cost=cost,
            rollout_exceptions=float(sum(len(g.exceptions) for g in groups)),
            judge=judge,
        ),
    )


def _completion_chars(trajectory: art.Trajectory) -> int:
    return sum(len(item.message.content or "") for item in trajectory.messages_and_choices if isinstance(item, Choice))


async def _train_and_record(
    run: Run, groups: list[art.TrajectoryGroup], judging: StepJudging | None, *, started: float, gathered_s: float
) -> int:
    """Train on the gathered groups and record the step. Its wall time is split into phases: ``judge_s`` (a judge
    call in flight; judging overlaps the rollouts it follows), ``rollout_s`` (the rest of gathering), ``train_s``."""
    spec = run.spec
    result = await run.backend.train(
        run.model, groups, learning_rate=spec.training.learning_rate, kl_penalty_coef=spec.training.kl_penalty_coef
    )
    train_s = time.monotonic() - started - gathered_s
    judge_s = judging.seconds if judging is not None else 0.0
    await run.model.log(groups, metrics=result.metrics, step=result.step, split="train")

    cost = StepCost(rollout_s=max(0.0, gathered_s - judge_s), judge_s=judge_s, train_s=train_s)
    values = step_values(groups, result.metrics, cost=cost, wall_time_s=time.monotonic() - started,
                         judge=judging.account() if judging is not None else None)  # fmt: skip
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        runs.record_step(session, job=job, step=result.step, values=values)
        rows = sampled([g.trajectories for g in groups], run.hooks.trajectories_per_step)
        runs.record_trajectories(session, job=job, step=result.step, split="train", rows=rows)
        alerts = check_alerts(session, job=job, spec=run.spec)  # committed with the row that fired them
    run.on_event("step", {"step": result.step, **values.columns()})
    run.announce(alerts)
    return result.step
