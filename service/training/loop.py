"""The training loop of one job, from warm start to a recorded stop.

It drives any ART backend through ART's Backend protocol (register, _train_sft, train) and logs
through ``model.log``. It records every step and validation point in the store and decides when
to stop from the validation series as recorded. It resumes: re-running a job continues after the
last step that both the store and the checkpoints hold, with the same scenarios and seeds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import art
from openai.types.chat.chat_completion import Choice
from sqlalchemy.engine import Engine
from sqlmodel import Session

import environments
from environments.base import Environment, Sampling
from environments.prompts import is_example
from judges.usage import BudgetSpent, JudgeBudget
from service import manifests
from service.alerts import check_alerts
from service.backends import make_backend
from service.evaluation.results import completion_tokens, example_row
from service.evaluation.runner import evaluate_into
from service.settings import Settings, get_settings
from service.spec import EvaluationSpec, JobSpec, LitellmModel
from service.store import runs
from service.store.tables import Alert, Job, JobStatus, StopReason, ValidationPoint
from service.training.control import JobHooks, JobInterrupted, fenced, interrupt_if_asked
from service.training.judging import Judge, StepJudging, judge_for
from service.training.schedule import cosine_schedule
from service.training.seeding import batch_for_step, derive_seed
from service.training.stopping import Decision, decide_from
from service.training.validation import validate

WARM_START_STATE_KEY = "artsvc_warm_start"
WARM_START_TURNS_PER_BATCH = 64
ROLLOUT_FAILURE_TOLERANCE = 0.1  # fraction of a step's rollouts that may raise before the step fails
JUDGE_OUTAGE_ATTEMPTS = 3  # tries of a step whose every group the judge failed, before the job stops


class JudgeOutage(Exception):
    """The judge scored none of a step's groups, JUDGE_OUTAGE_ATTEMPTS times in a row."""


@dataclass
class _Run:
    """What one execution of a job holds while it runs."""

    job_id: str
    spec: JobSpec
    env: Environment
    model: art.TrainableModel
    backend: art.Backend
    db: Engine
    hooks: JobHooks = field(default_factory=JobHooks)
    judge: Judge | None = None
    budget: JudgeBudget = field(default_factory=lambda: JudgeBudget(None))  # the judge's, shared by its calls
    baseline_accuracy: float | None = None  # the baseline model's accuracy on the validation examples

    def session(self) -> Session:
        """A session to read the store (writes go through ``write``)."""
        return Session(self.db, expire_on_commit=False)

    def write(self) -> AbstractContextManager[Session]:
        """A transaction writing the job, committed at the end of the block, only while this process holds it."""
        return fenced(self.db, self.hooks, self.job_id)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        self.hooks.on_event(kind, data)


def _sampled(trajectories_by_group: Sequence[Sequence[art.Trajectory]], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` rollouts, whole groups first, as rows an operator can read."""
    rows: list[dict[str, Any]] = []
    for group_index, trajectories in enumerate(trajectories_by_group):
        for trajectory in trajectories:
            if len(rows) >= limit:
                return rows
            scenario_id = trajectory.metadata.get("scenario_id")
            rows.append(
                {
                    "group_index": group_index,
                    "scenario_id": None if scenario_id is None else str(scenario_id),
                    "reward": trajectory.reward,
                    "messages": trajectory.messages(),
                    "details": {"metadata": trajectory.metadata, "metrics": trajectory.metrics, "logs": trajectory.logs},
                }
            )
    return rows


def _completion_chars(trajectory: art.Trajectory) -> int:
    return sum(len(item.message.content or "") for item in trajectory.messages_and_choices if isinstance(item, Choice))


def warm_start_batch_size(demos: Sequence[art.Trajectory]) -> int:
    """Demonstrations per optimizer step, so that each step sees about WARM_START_TURNS_PER_BATCH replies.

    A math demonstration is one reply and a 2048 game about fifty: batching whole trajectories
    by a fixed count would give a game-playing warm start fifty times fewer optimizer steps.
    Few-shot example turns of the opening are not replies.
    """
    turns = sum(
        isinstance(item, Choice) or (isinstance(item, dict) and item.get("role") == "assistant")
        for demo in demos
        for item in demo.messages_and_choices
        if not (isinstance(item, dict) and is_example(item))
    )
    return max(1, round(WARM_START_TURNS_PER_BATCH * len(demos) / max(1, turns)))


async def _warm_start(run: _Run) -> None:
    """Supervised warm start on the environment's demonstrations, once per model."""
    count = manifests.warm_start_examples(run.spec, run.env)
    if (run.model.read_state() or {}).get(WARM_START_STATE_KEY) or count == 0:
        return
    demos = run.env.demonstrations(seed=run.spec.seed, count=count)
    if not demos:
        return
    batch_size = warm_start_batch_size(demos)
    batches = -(-len(demos) // batch_size)
    config = art.TrainSFTConfig(
        learning_rate=cosine_schedule(run.spec.training.warm_start_learning_rate, batches), batch_size=batch_size
    )
    started = time.monotonic()
    done = 0
    async for metrics in run.backend._train_sft(run.model, demos, config, {}, False):
        done = batches if metrics.get("cache_hit") else done + 1
        run.on_event("warm_start", {"batch": done, "batches": batches, "loss": metrics.get("loss")})
    run.model.merge_state({WARM_START_STATE_KEY: {"examples": len(demos), "seconds": time.monotonic() - started}})


async def _resume_point(run: _Run) -> int:
    """The last step both the checkpoints and the store hold; newer work on either side is dropped."""
    checkpoint_step = await run.model.get_step()
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        recorded_step = runs.last_recorded_step(session, job_id=run.job_id)
        step = min(checkpoint_step, recorded_step)
        runs.discard_after(session, job=job, step=step)
    if checkpoint_step > step:
        await run.backend._delete_checkpoint_files(run.model, list(range(step + 1)))
    return step


async def _train_step(run: _Run, step: int) -> int:
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


def _record_judge_spend(run: _Run, step: int, judging: StepJudging) -> None:
    with run.write() as session:
        runs.record_judge_spend(session, job=runs.get_job(session, job_id=run.job_id), step=step, metrics=judging.metrics())


async def _rollouts(run: _Run, step: int, judging: StepJudging | None) -> list[art.TrajectoryGroup]:
    spec = run.spec
    scenarios = batch_for_step(run.env.scenarios("train"), seed=spec.seed, step=step, size=spec.training.groups_per_step)

    def rollouts(scenario: dict) -> art.TrajectoryGroup:
        return art.TrajectoryGroup(
            (
                run.env.rollout(
                    run.model,
                    scenario,
                    Sampling(temperature=spec.training.temperature, seed=derive_seed(spec.seed, "train", step, scenario["id"], i)),
                )
                for i in range(spec.training.group_size)
            ),
            metadata={"scenario_id": str(scenario["id"])},  # what a grader grades the group's replies against
        )

    total = spec.training.groups_per_step * spec.training.group_size
    return await art.gather_trajectory_groups(
        (rollouts(s) for s in scenarios),
        pbar_desc=None,
        max_exceptions=int(total * ROLLOUT_FAILURE_TOLERANCE),
        after_each=judging.after_each if judging is not None else None,
    )


async def _train_and_record(
    run: _Run, groups: list[art.TrajectoryGroup], judging: StepJudging | None, *, started: float, gathered_s: float
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

    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories]
    mean = sum(rewards) / len(rewards)
    metrics = result.metrics
    judge_metrics = judging.metrics() if judging is not None else {}
    values = {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "groups": len(groups),
        "zero_variance_groups": int(metrics.get("zero_variance_groups", 0)),
        "loss": metrics.get("loss"),
        "entropy": metrics.get("entropy"),
        "kl": metrics.get("kl"),
        "grad_norm": metrics.get("grad_norm"),
        "clip_fraction": metrics.get("clip_fraction"),
        "completion_length": sum(map(_completion_chars, trajectories)) / len(trajectories),
        "wall_time_s": time.monotonic() - started,
        "metrics": {
            **{k: float(v) for k, v in metrics.items()},
            "rollout_s": max(0.0, gathered_s - judge_s),
            "judge_s": judge_s,
            "train_s": train_s,
            "tokens_generated": float(sum(completion_tokens(t) or 0 for t in trajectories)),
            "rollout_exceptions": float(sum(len(g.exceptions) for g in groups)),
            **judge_metrics,
        },
    }
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        runs.record_step(session, job=job, step=result.step, values=values)
        sampled = _sampled([g.trajectories for g in groups], run.hooks.trajectories_per_step)
        runs.record_trajectories(session, job=job, step=result.step, split="train", rows=sampled)
        alerts = check_alerts(session, job=job, spec=run.spec)  # committed with the row that fired them
    run.on_event("step", {"step": result.step, **{k: v for k, v in values.items() if k != "metrics"}})
    _announce(run, alerts)
    return result.step


def _announce(run: _Run, alerts: list[Alert]) -> None:
    if alerts:
        run.hooks.on_alert(alerts)
        for alert in alerts:
            run.on_event("alert", {"kind": alert.kind, "step": alert.step, "message": alert.message})


async def _validate_and_decide(run: _Run, step: int, *, due: bool = True) -> Decision:
    """Validate at ``step`` if due and not yet recorded, then decide from the series as folded on its newest point."""
    spec = run.spec
    with run.session() as session:
        latest = runs.latest_point(session, job_id=run.job_id)  # points come in step order: none is past ``step``
    if due and (latest is None or latest.step < step) and (measured := await _measure(run, step, latest)) is not None:
        values, trajectories = measured
        rows = run.env.scenarios("val")[: spec.validation.max_examples]
        results = [example_row(run.env, t, position=i, scenario_id=str(row["id"]))
                   for i, (row, t) in enumerate(zip(rows, trajectories))]  # fmt: skip
        with run.write() as session:
            job = runs.get_job(session, job_id=run.job_id)
            latest = runs.record_validation(session, job=job, step=step, values=values)
            runs.record_example_results(session, job=job, step=step, rows=results)
            sampled = _sampled([trajectories], run.hooks.trajectories_per_step)
            runs.record_trajectories(session, job=job, step=step, split="val", rows=sampled)
            alerts = check_alerts(session, job=job, spec=run.spec)  # committed with the row that fired them
        run.on_event("validation", {"step": step, **values})
        _announce(run, alerts)
    v = spec.validation
    decision = decide_from(runs.progress(latest), step=step, max_steps=spec.training.max_steps, patience=v.patience,
                           target_accuracy=v.target_accuracy)  # fmt: skip
    if decision.stop_reason is None and spec.alerts.stop_on_divergence and _diverged(run):
        return replace(decision, stop_reason=StopReason.divergence)
    if decision.stop_reason is None and _beat_baseline(run, latest.accuracy if latest else None):
        return replace(decision, stop_reason=StopReason.beat_baseline)
    return decision


def _beat_baseline(run: _Run, accuracy: float | None) -> bool:
    margin = run.spec.validation.beat_baseline_by
    if margin is None or run.baseline_accuracy is None or accuracy is None:
        return False
    return accuracy >= run.baseline_accuracy + margin


async def _baseline(run: _Run, settings: Settings, data_dir: Path) -> float | None:
    """The baseline model's accuracy on the job's validation examples, measured once as an evaluation job of
    this job (re-measured if a crash interrupted it); None when the job names no baseline."""
    v, spec = run.spec.validation, run.spec
    if v.baseline_model is None:
        return None
    with run.write() as session:
        evaluation = runs.baseline_evaluation(session, job_id=run.job_id)
        if evaluation is not None and evaluation.status == JobStatus.succeeded and evaluation.summary:
            return evaluation.summary["pass_rate"]
        eval_spec = EvaluationSpec(model=LitellmModel(litellm=v.baseline_model), environment=spec.environment,
                                   environment_args=spec.environment_args, split="val", max_examples=v.max_examples,
                                   temperature=v.temperature, seed=spec.seed)  # fmt: skip
        if evaluation is None:
            job = runs.get_job(session, job_id=run.job_id)
            evaluation = runs.create_evaluation(session, spec=eval_spec, environment=spec.environment,
                                                owner_id=job.owner_id, parent_id=job.id)  # fmt: skip
        runs.mark_running(session, job=evaluation)  # running without a lease: no worker claims it from this job
    run.on_event("baseline", {"model": v.baseline_model, "evaluation_id": evaluation.id})
    ended = await evaluate_into(evaluation.id, eval_spec, db=run.db, data_dir=data_dir, settings=settings,
                                hooks=run.hooks)  # stopped, and written, as the job it measures for  # fmt: skip
    accuracy = ended.summary["pass_rate"]
    run.on_event("baseline", {"model": v.baseline_model, "evaluation_id": evaluation.id, "accuracy": accuracy})
    return accuracy


async def _measure(
    run: _Run, step: int, latest: ValidationPoint | None
) -> tuple[dict[str, Any], list[art.Trajectory]] | None:
    """The point the stopping rules read at ``step``: ground-truth validation accuracy, or in ruler mode
    (no ground truth) the mean RULER reward of the steps since the ``latest`` point (none at step 0)."""
    spec = run.spec
    if spec.reward.mode == "ruler":
        since = latest.step if latest is not None else 0
        with run.session() as session:
            rewards = [s.reward_mean for s in runs.steps(session, job_id=run.job_id, after=since) if s.step <= step]
        if not rewards:
            return None
        values = {"accuracy": sum(rewards) / len(rewards), "greedy_accuracy": None, "examples": len(rewards),
                  "temperature": spec.training.temperature, "outcomes": {}, "wall_time_s": 0.0}  # fmt: skip
        return values, []
    rows = run.env.scenarios("val")[: spec.validation.max_examples]
    result = await validate(run.env, run.model, rows, seed=spec.seed, temperature=spec.validation.temperature)
    await run.model.log(result.trajectories, split="val", step=step)
    return result.row_values(), result.trajectories


def _diverged(run: _Run) -> bool:
    with run.session() as session:
        return runs.has_alert(session, job_id=run.job_id, kind="divergence")


def _control(run: _Run) -> StopReason | None:
    """At a step boundary: cancelled (recorded as the stop), or interrupted by the process (not recorded)."""
    with run.session() as session:
        if runs.get_job(session, job_id=run.job_id).cancel_requested:
            return StopReason.cancelled
    interrupt_if_asked(run.hooks, run.job_id)
    return None


def _finish(
    db: Engine, job_id: str, hooks: JobHooks, *, status: JobStatus, reason: StopReason, decision: Decision | None,
    error: str | None = None,
) -> Job:
    with fenced(db, hooks, job_id) as session:
        job = runs.get_job(session, job_id=job_id)
        points = runs.validation_points(session, job_id=job_id)
        best = decision if decision is not None and decision.best_step is not None else None
        if best is None and points:  # a failed run still reports the best point it recorded
            best_point = max(points, key=lambda p: (p.accuracy, -p.step))
            best = Decision(None, best_point.step, best_point.accuracy, 0)
        runs.finish_job(
            session,
            job=job,
            status=status,
            stop_reason=reason,
            best_step=best.best_step if best else None,
            best_val_accuracy=best.best_accuracy if best else None,
            step0_val_accuracy=next((p.accuracy for p in points if p.step == 0), None),
            error=error,
        )
    return job


def model_for(job_id: str, spec: JobSpec, env: Environment, data_dir: Path) -> art.TrainableModel:
    """The ART model a job trains: one per job, so concurrent jobs never share checkpoints."""
    return art.TrainableModel(
        name=f"{spec.model.name}-{job_id[:8]}",
        project="artsvc",
        base_model=manifests.base_model_for(spec, env),
        base_path=str(data_dir / "art"),
    )


async def run_job(
    job_id: str, *, db: Engine, data_dir: Path, hooks: JobHooks | None = None, settings: Settings | None = None
) -> Job:
    """Run (or resume) the job to a stop; the returned job row says how it ended.

    Failures inside the run are recorded on the job (status failed, stop reason error) and
    re-raised to the caller. An interruption (Ctrl-C, task cancellation, JobInterrupted from
    ``hooks.should_stop``, LeaseLost from ``hooks.holds_job``) records nothing: the job stays
    resumable from its last checkpointed step. A cancel requested through the store stops it at the next step boundary as cancelled.
    ``settings`` (default: the process's) say which judges the operator allows and where they are.
    """
    hooks = hooks or JobHooks()
    settings = settings or get_settings()
    with fenced(db, hooks, job_id) as session:
        job = runs.start_run(session, job_id=job_id)
        spent = runs.judge_spent_usd(session, job_id=job_id)
    spec = JobSpec.model_validate(job.spec)
    budget = JudgeBudget(spec.reward.max_judge_cost_usd, spent_usd=spent)
    backend: art.Backend | None = None
    try:
        env = environments.load(spec.environment, spec.environment_args)
        graded_against = {str(row["id"]): row for row in env.scenarios("train")} if spec.reward.mode == "grader" else {}
        judge = judge_for(spec.reward, settings, graded_against, budget)
        backend = make_backend(spec.model.backend, data_dir=data_dir, seed=spec.seed)
        run = _Run(job_id, spec, env, model_for(job_id, spec, env, data_dir), backend, db, hooks, judge, budget)
        _record_manifest(run)
        run.baseline_accuracy = await _baseline(run, settings, data_dir)
        await run.model.register(backend)
        await _warm_start(run)
        step = await _resume_point(run)
        decision = await _validate_if_due(run, step)
        while decision.stop_reason is None:
            if (control := _control(run)) is not None:
                return _finish(db, job_id, hooks, status=JobStatus.cancelled, reason=control, decision=decision)
            if budget.spent:
                return _stop_for_budget(run, step, decision)
            try:
                step = await _train_step(run, step + 1)
            except BudgetSpent:  # spent during the step, before any of its groups was judged
                return _stop_for_budget(run, step, decision)
            decision = await _validate_if_due(run, step)
            await _prune_checkpoints(run, step, decision.best_step)
        return _finish(db, job_id, hooks, status=JobStatus.succeeded, reason=decision.stop_reason, decision=decision)
    except JobInterrupted:
        raise
    except JudgeOutage as exc:  # the judge's failure, recorded as the job's stop; the worker goes on
        return _finish(db, job_id, hooks, status=JobStatus.failed, reason=StopReason.error, decision=None, error=str(exc))
    except Exception as exc:
        _finish(db, job_id, hooks, status=JobStatus.failed, reason=StopReason.error, decision=None, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if backend is not None:
            await backend.close()


def _record_manifest(run: _Run) -> None:
    """What this run measures with: the manifest stored at submission, refreshed for the code of the process that
    trains it (manifests.refreshed), with that process's runtime, which only it knows."""
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        stored = manifests.refreshed(job.manifest, lambda: manifests.training_manifest(run.spec, run.env))
        job.manifest = {**stored, "runtime": manifests.runtime()}
        session.add(job)


def _stop_for_budget(run: _Run, step: int, decision: Decision) -> Job:
    """End the job as succeeded with stop reason budget: its judge calls spent ``reward.max_judge_cost_usd`` (the
    budget admits each call, so by at most about one call more: judges/usage.py)."""
    limit = run.spec.reward.max_judge_cost_usd
    run.on_event("budget", {"step": step, "judge_cost_usd": run.budget.spent_usd, "max_judge_cost_usd": limit})
    return _finish(run.db, run.job_id, run.hooks, status=JobStatus.succeeded, reason=StopReason.budget, decision=decision)


async def _prune_checkpoints(run: _Run, step: int, best_step: int | None) -> None:
    """Keep the warm start, the best step, and the two newest (a resume may roll back one step)."""
    keep = {0, step - 1, step} | ({best_step} if best_step is not None else set())
    await run.backend._delete_checkpoint_files(run.model, sorted(keep))


async def _validate_if_due(run: _Run, step: int) -> Decision:
    due = step % run.spec.validation.every_n_steps == 0 or step >= run.spec.training.max_steps
    return await _validate_and_decide(run, step, due=due)
