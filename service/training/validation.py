"""Validation: the policy as it is used (sampled at the job's temperature), with greedy beside it, recorded as the
job's validation points (the series the stopping rules read).

Each validation example is sampled with the same seed at every evaluation (common random
numbers), so differences between steps reflect the policy, not the dice.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import art

from environments.base import Environment, Sampling
from service.alerts import check_alerts
from service.evaluation.results import completion_tokens, example_row, outcome_of
from service.runner.seeding import derive_seed
from service.store import runs
from service.store.records import ValidationCreate
from service.store.tables import BASE_STEP, ValidationPoint
from service.training.run import Run, sampled


async def validate(
    env: Environment, model: art.Model, rows: Sequence[dict], *, seed: int, temperature: float, greedy: bool = True
) -> tuple[ValidationCreate, list[art.Trajectory]]:
    """Accuracy on ``rows`` at ``temperature`` (the recorded number) and, if ``greedy``, greedily, with the sampled
    rollouts.

    Each example's sampled and greedy rollouts are started side by side, so the serving backend decodes them in one
    batch and encodes their shared prompt once (done one pass after the other, every prompt was encoded twice). At
    temperature 0 the sampled pass is the greedy one: it is played once."""
    started = time.monotonic()
    temperatures = (temperature, 0.0) if temperature > 0 and greedy else (temperature,)
    played = await art.gather_trajectories(
        (
            env.rollout(model, row, Sampling(temperature=t, seed=derive_seed(seed, "val", row["id"])))
            for row in rows
            for t in temperatures
        ),
        pbar_desc=None,
    )
    passes = len(temperatures)
    trajectories, greedy_trajectories = played[0::passes], played[passes - 1 :: passes]
    accuracy = sum(env.is_correct(t) for t in trajectories) / len(trajectories)
    greedy_played = greedy or temperature == 0
    greedy_accuracy = sum(env.is_correct(t) for t in greedy_trajectories) / len(rows) if greedy_played else None
    tokens = [completion_tokens(t) for t in played]
    values = ValidationCreate(
        accuracy=accuracy,
        greedy_accuracy=greedy_accuracy,
        examples=len(rows),
        temperature=temperature,
        outcomes=dict(sorted(Counter(outcome_of(env, t) for t in trajectories).items())),
        wall_time_s=time.monotonic() - started,
        tokens_generated=None if any(t is None for t in tokens) else sum(tokens),
    )
    return values, trajectories


async def record_point(run: Run, step: int, *, due: bool) -> ValidationPoint | None:
    """The job's newest validation point, after validating at ``step`` if ``due`` and not yet recorded (the point,
    its per-example rows, sampled rollouts and the alerts it fires commit together)."""
    with run.session() as session:
        latest = runs.latest_point(session, job_id=run.job_id)  # points come in step order: none is past ``step``
    if due and (latest is None or latest.step < step) and (measured := await _measure(run, step, latest)) is not None:
        latest = _record(run, step, *measured)
    return latest


async def record_base_point(run: Run) -> None:
    """Validate the base model, before its warm start, once (a resume finds the point): the curve then shows what
    the warm start did and what RL did after it. Ruler mode has no ground truth to measure it by."""
    with run.session() as session:
        if run.spec.reward.mode == "ruler" or runs.base_point(session, job_id=run.job_id) is not None:
            return
    _record(run, BASE_STEP, *await _validated(run, BASE_STEP))


def _record(run: Run, step: int, values: ValidationCreate, trajectories: list[art.Trajectory]) -> ValidationPoint:
    """Store a measured point with its per-example rows and sampled rollouts, and the alerts it fires, together."""
    rows = run.env.scenarios("val")[: run.spec.validation.max_examples]
    results = [example_row(run.env, t, position=i, scenario_id=str(row["id"]))
               for i, (row, t) in enumerate(zip(rows, trajectories))]  # fmt: skip
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        point = runs.record_validation(session, job=job, step=step, values=values)
        runs.record_example_results(session, job=job, step=step, rows=results)
        kept = sampled([trajectories], run.hooks.trajectories_per_step)
        runs.record_trajectories(session, job=job, step=step, split="val", rows=kept)
        alerts = check_alerts(session, job=job, spec=run.spec)  # committed with the row that fired them
    run.on_event("validation", {"step": step, **values.columns()})
    run.announce(alerts)
    return point


async def _measure(
    run: Run, step: int, latest: ValidationPoint | None
) -> tuple[ValidationCreate, list[art.Trajectory]] | None:
    """The point the stopping rules read at ``step``: ground-truth validation accuracy, or in ruler mode
    (no ground truth) the mean RULER reward of the steps since the ``latest`` point (none at step 0)."""
    spec = run.spec
    if spec.reward.mode == "ruler":
        since = latest.step if latest is not None else 0
        with run.session() as session:
            rewards = [s.reward_mean for s in runs.steps(session, job_id=run.job_id, after=since) if s.step <= step]
        if not rewards:
            return None
        values = ValidationCreate(accuracy=sum(rewards) / len(rewards), greedy_accuracy=None, examples=len(rewards),
                                  temperature=spec.training.temperature, outcomes={}, wall_time_s=0.0)  # fmt: skip
        return values, []
    return await _validated(run, step)


async def _validated(run: Run, step: int) -> tuple[ValidationCreate, list[art.Trajectory]]:
    """Ground-truth validation of the policy as served now, stopped by a cancel or a lost lease within a second."""
    spec = run.spec
    rows = run.env.scenarios("val")[: spec.validation.max_examples]
    measured = validate(run.env, run.model, rows, seed=spec.seed, temperature=spec.validation.temperature,
                        greedy=spec.validation.greedy)  # fmt: skip
    values, trajectories = await run.check_stop.guard(measured)
    await run.model.log(trajectories, split="val", step=step)
    return values, trajectories
