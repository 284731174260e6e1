"""Data functions for a job's run: create it, record steps and validation points, finish it.

Functions take a session and keyword arguments and never commit: the caller decides what
one transaction is (a step row, its event and the job's progress commit together).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, bindparam, union_all
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, delete, select

from service.spec import EvaluationSpec, JobSpec
from service.store import queue_signal, running
from service.store.events import append_event
from service.store.progress import Progress, advance
from service.store.records import JudgeAccount, StepCost, StepCreate, StepJudge, ValidationCreate
from service.store.tables import (
    BASE_STEP,
    LOCAL_OWNER,
    Alert,
    ExampleResult,
    Job,
    JobEvent,
    JobKind,
    JobStatus,
    SampledTrajectory,
    StopReason,
    TrainingStep,
    ValidationPoint,
    utcnow,
)

STEP_EVENT_KINDS = ("step", "validation", "alert")  # events that belong to a step and go when it is rolled back
POLICY_POINT = col(ValidationPoint.step) >= 0  # the policy's series: every point but the base model's (BASE_STEP)


def queue(session: Session, job: Job) -> Job:
    """Add ``job`` (made by ``new_job``) to the queue, with its ``queued`` event."""
    session.add(job)
    append_event(session, job_id=job.id, kind="queued", data=_queued_event_data(job))
    queue_signal.announce(session)
    return job


def insert_queued(session: Session, job: Job) -> Job:
    """``queue`` for a submission, whose write the API may run on its event loop: the job's row and its ``queued``
    event as two Core inserts on the session's connection, no unit of work (the ORM's flush was a third of a
    submission's time there). ``job`` stays outside the session: read it, do not change it. No row lock is taken:
    until this transaction commits, no one else can see the job."""
    connection = session.connection()
    connection.execute(_INSERT_JOB, {column: getattr(job, column) for column in _JOB_COLUMNS})
    event = {"job_id": job.id, "kind": "queued", "step": None, "data": _queued_event_data(job), "created_at": utcnow()}
    connection.execute(_INSERT_EVENT, event)
    queue_signal.announce(session)
    return job


def _queued_event_data(job: Job) -> dict[str, Any]:
    return {"environment": job.environment, "kind": job.kind}


_JOB_COLUMNS = tuple(Job.__table__.columns.keys())  # type: ignore[attr-defined]
_INSERT_JOB = Job.__table__.insert()  # type: ignore[attr-defined]
_INSERT_EVENT = JobEvent.__table__.insert()  # type: ignore[attr-defined]


def create_job(
    session: Session,
    *,
    spec: JobSpec,
    owner_id: str = LOCAL_OWNER,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> Job:
    """A queued training job."""
    return queue(session, new_job(spec=spec, owner_id=owner_id, idempotency_key=idempotency_key, request_hash=request_hash))


def new_job(
    *, spec: JobSpec, owner_id: str = LOCAL_OWNER, idempotency_key: str | None = None, request_hash: str | None = None
) -> Job:
    """A training job, not yet queued: made before a writer's turn, which then only has to ``queue`` it."""
    spec_json = spec.model_dump(mode="json")
    return Job(id=str(uuid.uuid4()), environment=spec.environment, spec=spec_json, owner_id=owner_id,
               idempotency_key=idempotency_key, request_hash=request_hash)  # fmt: skip


def create_evaluation(
    session: Session, *, spec: EvaluationSpec, environment: str, owner_id: str = LOCAL_OWNER, parent_id: str | None = None
) -> Job:
    """A queued evaluation (``environment`` resolved: the spec may leave it to the evaluated job)."""
    spec_json = spec.model_dump(mode="json")
    return queue(session, Job(id=str(uuid.uuid4()), kind=JobKind.evaluation, environment=environment, spec=spec_json,
                               owner_id=owner_id, parent_id=parent_id))  # fmt: skip


def get_job(session: Session, *, job_id: str) -> Job | None:
    return session.get(Job, job_id)


# What the API's reads of jobs show: every column but the manifest, JSON to decode that only the job's own page shows.
SHOWN_COLUMNS = [column for column in Job.__table__.columns if column.name != "manifest"]
_JOB_ROW = select(*SHOWN_COLUMNS).where(Job.__table__.c.id == bindparam("job_id"))


def job_row(connection: Connection, *, job_id: str) -> Row[Any] | None:
    """A job's ``SHOWN_COLUMNS`` as a Core row: a fraction of ``get_job``'s cost (no session, no identity map), for a
    path as hot as ``GET /v1/jobs/{id}``."""
    return connection.execute(_JOB_ROW, {"job_id": job_id}).first()


def is_job_id(text: str) -> bool:
    """Job ids are UUIDs; anything else is not looked up (some databases refuse odd bytes such as NUL)."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def start_run(session: Session, *, job_id: str) -> Job:
    """The job, marked running by the process about to run it; LookupError if the store has no such job."""
    job = get_job(session, job_id=job_id)
    if job is None:
        raise LookupError(f"no job {job_id!r} in the store")
    mark_running(session, job=job)
    return job


def mark_running(session: Session, *, job: Job) -> None:
    resumed = job.started_at is not None
    job.status = JobStatus.running
    job.started_at = job.started_at or utcnow()
    session.add(job)
    data = {"worker_id": job.worker_id, "attempt": job.attempts, "step": job.step}
    append_event(session, job_id=job.id, kind="resumed" if resumed else "started", data=data)


def record_step(session: Session, *, job: Job, step: int, values: StepCreate) -> TrainingStep:
    """A step's row, with the job's running totals carried on from the step before (the one row it reads)."""
    before = latest_step(session, job_id=job.id)
    given, metrics, judge = values.columns(), values.metrics.column(), values.metrics.judge
    row = TrainingStep(job_id=job.id, step=step, judge_agreement=judge.judge_agreement if judge is not None else None,
                       totals=running.advanced(before.totals if before else {}, metrics), metrics=metrics, **given)  # fmt: skip
    job.step = step
    session.add_all([row, job])
    append_event(session, job_id=job.id, kind="step", step=step, data=given)
    return row


def record_validation(session: Session, *, job: Job, step: int, values: ValidationCreate) -> ValidationPoint:
    """A validation point, with the stopping rules' fold carried on from the point before (the one row it reads)
    by the job's own ``validation.min_delta``; the base model's point (BASE_STEP) is outside that series."""
    min_delta = JobSpec.model_validate(job.spec).validation.min_delta
    before = None if step == BASE_STEP else progress(latest_point(session, job_id=job.id))  # the base starts none
    fold = advance(before, step, values.accuracy, min_delta=min_delta)
    given = values.columns()
    row = ValidationPoint(job_id=job.id, step=step, best_step=fold.best_step, best_accuracy=fold.best_accuracy,
                          anchor_accuracy=fold.anchor_accuracy, evaluations_without_gain=fold.evaluations_without_gain,
                          **given)  # fmt: skip
    session.add(row)
    append_event(session, job_id=job.id, kind="validation", step=step, data=given)
    return row


def record_trajectories(session: Session, *, job: Job, step: int, split: str, rows: list[dict[str, Any]]) -> None:
    """Keep sampled rollouts of ``step`` (each a dict of SampledTrajectory's fields) for operators to read."""
    session.add_all(SampledTrajectory(job_id=job.id, step=step, split=split, **row) for row in rows)


def record_example_results(session: Session, *, job: Job, step: int, rows: list[dict[str, Any]]) -> None:
    """Per-example results of a measurement at ``step`` (service/evaluation/results.py's rows), replacing any."""
    session.exec(delete(ExampleResult).where(col(ExampleResult.job_id) == job.id, col(ExampleResult.step) == step))
    session.add_all(ExampleResult(job_id=job.id, step=step, **row) for row in rows)


def example_results(session: Session, *, job_id: str, step: int) -> list[ExampleResult]:
    query = select(ExampleResult).where(ExampleResult.job_id == job_id, ExampleResult.step == step)
    return list(session.exec(query.order_by(col(ExampleResult.position))))


def baseline_evaluation(session: Session, *, job_id: str) -> Job | None:
    """The evaluation of a training job's baseline model, if it asked for one."""
    query = select(Job).where(Job.parent_id == job_id, Job.kind == JobKind.evaluation).order_by(col(Job.created_at))
    return session.exec(query.limit(1)).first()


def has_alert(session: Session, *, job_id: str, kind: str) -> bool:
    return session.exec(select(Alert.id).where(Alert.job_id == job_id, Alert.kind == kind).limit(1)).first() is not None


def steps(session: Session, *, job_id: str, after: int | None = None) -> list[TrainingStep]:
    """The job's step rows in step order (only those past step ``after`` if given)."""
    query = select(TrainingStep).where(TrainingStep.job_id == job_id)
    if after is not None:
        query = query.where(col(TrainingStep.step) > after)
    return list(session.exec(query.order_by(col(TrainingStep.step))))


def latest_step(session: Session, *, job_id: str) -> TrainingStep | None:
    query = select(TrainingStep).where(TrainingStep.job_id == job_id).order_by(col(TrainingStep.step).desc())
    return session.exec(query.limit(1)).first()


def recent_steps(session: Session, *, job_id: str, count: int, after: int | None = None) -> list[TrainingStep]:
    """The job's newest ``count`` step rows and any past step ``after``, in step order: one statement, two index
    range scans (an OR of the two would let PostgreSQL's planner scan the whole table)."""
    of_job = select(TrainingStep).where(TrainingStep.job_id == job_id)
    newest = of_job.order_by(col(TrainingStep.step).desc()).limit(count).subquery()
    query = select(newest) if after is None else union_all(select(newest), of_job.where(col(TrainingStep.step) > after))
    rows = session.exec(select(aliased(TrainingStep, query.subquery()))).all()
    return sorted({row.step: row for row in rows}.values(), key=lambda row: row.step)  # a row in both: once


def recent_judged_steps(session: Session, *, job_id: str, count: int) -> list[TrainingStep]:
    """The job's newest ``count`` steps with a judge agreement, in step order (a partial index finds them)."""
    query = select(TrainingStep).where(TrainingStep.job_id == job_id, col(TrainingStep.judge_agreement).is_not(None))
    return list(reversed(session.exec(query.order_by(col(TrainingStep.step).desc()).limit(count)).all()))


def validation_points(session: Session, *, job_id: str, with_base: bool = False) -> list[ValidationPoint]:
    """The job's validation points in step order: the policy's series from step 0, which the stopping rules, the
    best step and the alerts read, and first the base model's point (BASE_STEP) if ``with_base`` and measured."""
    query = select(ValidationPoint).where(ValidationPoint.job_id == job_id)
    if not with_base:
        query = query.where(POLICY_POINT)
    return list(session.exec(query.order_by(col(ValidationPoint.step))))


def base_point(session: Session, *, job_id: str) -> ValidationPoint | None:
    """The base model's validation point, measured before the warm start (None: no warm start, or not yet)."""
    return session.exec(select(ValidationPoint).where(ValidationPoint.job_id == job_id,
                                                      ValidationPoint.step == BASE_STEP)).first()  # fmt: skip


def recent_points(session: Session, *, job_id: str, count: int) -> list[ValidationPoint]:
    """The policy's newest ``count`` validation points, in step order."""
    query = select(ValidationPoint).where(ValidationPoint.job_id == job_id, POLICY_POINT)
    return list(reversed(session.exec(query.order_by(col(ValidationPoint.step).desc()).limit(count)).all()))


def first_point(session: Session, *, job_id: str) -> ValidationPoint | None:
    """The policy's first validation point: step 0 (the policy before RL), or a judged job's first step, which has no
    ground truth to measure at step 0. ``validation.target_gain`` counts from it."""
    return session.exec(select(ValidationPoint).where(ValidationPoint.job_id == job_id, POLICY_POINT)
                        .order_by(col(ValidationPoint.step)).limit(1)).first()  # fmt: skip


def latest_point(session: Session, *, job_id: str) -> ValidationPoint | None:
    return next(iter(recent_points(session, job_id=job_id, count=1)), None)


def progress(point: ValidationPoint | None) -> Progress | None:
    """The stopping rules' fold of the series up to ``point``, as stored on it (None: no point)."""
    if point is None:
        return None
    return Progress(point.best_step, point.best_accuracy, point.anchor_accuracy, point.evaluations_without_gain,
                    point.accuracy)  # fmt: skip


def last_recorded_step(session: Session, *, job_id: str) -> int:
    latest = latest_step(session, job_id=job_id)
    return latest.step if latest else 0


def discard_after(session: Session, *, job: Job, step: int) -> None:
    """Remove everything recorded past ``step`` (work the checkpoints no longer hold): step rows,
    validation points, alerts, sampled trajectories and their events."""
    for table in (TrainingStep, ValidationPoint, Alert, SampledTrajectory, ExampleResult):
        session.exec(delete(table).where(col(table.job_id) == job.id, col(table.step) > step))
    session.exec(
        delete(JobEvent).where(
            col(JobEvent.job_id) == job.id, col(JobEvent.step) > step, col(JobEvent.kind).in_(STEP_EVENT_KINDS)
        )
    )
    job.step = step
    session.add(job)


def finish_job(
    session: Session,
    *,
    job: Job,
    status: JobStatus,
    stop_reason: StopReason | None,
    best_step: int | None = None,
    best_val_accuracy: float | None = None,
    step0_val_accuracy: float | None = None,
    base_val_accuracy: float | None = None,
    error: str | None = None,
) -> None:
    """Record how a job ended (an evaluation has no stop reason) and append its ``finished`` event."""
    job.status = status
    job.stop_reason = stop_reason
    job.best_step = best_step
    job.best_val_accuracy = best_val_accuracy
    job.step0_val_accuracy = step0_val_accuracy
    job.base_val_accuracy = base_val_accuracy
    job.error = error
    job.finished_at = utcnow()
    job.worker_id = None
    job.lease_expires_at = None
    session.add(job)
    data = {"status": status.value, "stop_reason": stop_reason and stop_reason.value, "best_step": best_step,
            "best_val_accuracy": best_val_accuracy, "step": job.step, "error": error}  # fmt: skip
    append_event(session, job_id=job.id, kind="finished", data=data)


JUDGE_SPEND_EVENT = "judge_spend"  # judging of a step that recorded no step row (the judge down, the budget spent)


def record_judge_spend(session: Session, *, job: Job, step: int, judge: StepJudge) -> None:
    """Keep what a step's judge calls cost when the step itself is not recorded, so the budget still counts it."""
    append_event(session, job_id=job.id, kind=JUDGE_SPEND_EVENT, step=step, data=judge.column())


def unrecorded_judging(session: Session, *, job_id: str) -> list[dict]:
    """The judge accounts of steps that recorded no step row (:func:`record_judge_spend`), oldest first, as stored."""
    query = select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == JUDGE_SPEND_EVENT)
    return list(session.exec(query.order_by(col(JobEvent.id))))


def judge_totals(session: Session, *, job_id: str) -> dict[str, float] | None:
    """A job's judge account (a JudgeAccount's fields; each step's metrics hold the step's), summed over its
    steps (their running totals) and the judging of steps that recorded none; None if nothing was judged."""
    return running.judge_totals(_totals(session, job_id), unrecorded_judging(session, job_id=job_id))


def judge_spent_usd(session: Session, *, job_id: str) -> float:
    """What a job's judge calls have cost: its steps' judging and the judging of steps that recorded none."""
    totals = judge_totals(session, job_id=job_id)
    return JudgeAccount(**totals).judge_cost_usd if totals is not None else 0.0


def cost_totals(session: Session, *, job_id: str) -> dict[str, Any]:
    """What a training job has spent so far: tokens its policy generated (training rollouts, validation's
    sampled and greedy passes), its judge's tokens and dollars, and wall time per phase."""
    points = validation_points(session, job_id=job_id, with_base=True)  # the base model's validation was spent too
    return cost_of(_totals(session, job_id), points, unrecorded_judging(session, job_id=job_id))


def _totals(session: Session, job_id: str) -> dict[str, float]:
    latest = latest_step(session, job_id=job_id)
    return latest.totals if latest else {}


def cost_of(totals: dict[str, float], points: list[ValidationPoint], unrecorded: Sequence[dict] = ()) -> dict[str, Any]:
    """:func:`cost_totals` of the newest step's running ``totals`` and rows already read (the API's CostPublic)."""
    steps = StepCost.of_column(totals) or StepCost()
    judged = running.judge_totals(totals, unrecorded)
    judge = JudgeAccount(**judged) if judged is not None else None
    validation_tokens = [p.tokens_generated for p in points]
    return {
        "tokens_generated_train": int(steps.tokens_generated),
        "tokens_generated_validation": sum(t or 0 for t in validation_tokens),
        "judge_prompt_tokens": int(judge.judge_prompt_tokens) if judge is not None else 0,
        "judge_completion_tokens": int(judge.judge_completion_tokens) if judge is not None else 0,
        "judge_cost_usd": judge.judge_cost_usd if judge is not None else 0.0,
        "wall_s": {
            "rollout": steps.rollout_s,
            "judge": steps.judge_s,
            "train": steps.train_s,
            "validation": sum(p.wall_time_s for p in points),
        },
    }
