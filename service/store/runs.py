"""Data functions for a job's run: create it, record steps and validation points, finish it.

Functions take a session and keyword arguments and never commit: the caller decides what
one transaction is (a step row, its event and the job's progress commit together).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlmodel import Session, col, delete, select

from service.spec import JobSpec
from service.store.events import append_event
from service.store.tables import (
    LOCAL_OWNER,
    Alert,
    Job,
    JobEvent,
    JobStatus,
    SampledTrajectory,
    StopReason,
    TrainingStep,
    ValidationPoint,
    utcnow,
)

STEP_EVENT_KINDS = ("step", "validation", "alert")  # events that belong to a step and go when it is rolled back


def create_job(
    session: Session,
    *,
    spec: JobSpec,
    owner_id: str = LOCAL_OWNER,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> Job:
    job = Job(
        id=str(uuid.uuid4()),
        environment=spec.environment,
        spec=spec.model_dump(mode="json"),
        owner_id=owner_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )
    session.add(job)
    append_event(session, job_id=job.id, kind="queued", data={"environment": spec.environment})
    return job


def get_job(session: Session, *, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def mark_running(session: Session, *, job: Job) -> None:
    resumed = job.started_at is not None
    job.status = JobStatus.running
    job.started_at = job.started_at or utcnow()
    session.add(job)
    data = {"worker_id": job.worker_id, "attempt": job.attempts, "step": job.step}
    append_event(session, job_id=job.id, kind="resumed" if resumed else "started", data=data)


def record_step(session: Session, *, job: Job, step: int, values: dict[str, Any]) -> TrainingStep:
    row = TrainingStep(job_id=job.id, step=step, **values)
    job.step = step
    session.add_all([row, job])
    append_event(session, job_id=job.id, kind="step", step=step, data={k: v for k, v in values.items() if k != "metrics"})
    return row


def record_validation(session: Session, *, job: Job, step: int, values: dict[str, Any]) -> ValidationPoint:
    row = ValidationPoint(job_id=job.id, step=step, **values)
    session.add(row)
    append_event(session, job_id=job.id, kind="validation", step=step, data=values)
    return row


def record_trajectories(session: Session, *, job: Job, step: int, split: str, rows: list[dict[str, Any]]) -> None:
    """Keep sampled rollouts of ``step`` (each a dict of SampledTrajectory's fields) for operators to read."""
    session.add_all(SampledTrajectory(job_id=job.id, step=step, split=split, **row) for row in rows)


def has_alert(session: Session, *, job_id: str, kind: str) -> bool:
    return session.exec(select(Alert.id).where(Alert.job_id == job_id, Alert.kind == kind).limit(1)).first() is not None


def steps(session: Session, *, job_id: str) -> list[TrainingStep]:
    return list(session.exec(select(TrainingStep).where(TrainingStep.job_id == job_id).order_by(col(TrainingStep.step))))


def validation_points(session: Session, *, job_id: str) -> list[ValidationPoint]:
    query = select(ValidationPoint).where(ValidationPoint.job_id == job_id).order_by(col(ValidationPoint.step))
    return list(session.exec(query))


def last_recorded_step(session: Session, *, job_id: str) -> int:
    recorded = steps(session, job_id=job_id)
    return recorded[-1].step if recorded else 0


def discard_after(session: Session, *, job: Job, step: int) -> None:
    """Remove everything recorded past ``step`` (work the checkpoints no longer hold): step rows,
    validation points, alerts, sampled trajectories and their events."""
    for table in (TrainingStep, ValidationPoint, Alert, SampledTrajectory):
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
    stop_reason: StopReason,
    best_step: int | None,
    best_val_accuracy: float | None,
    step0_val_accuracy: float | None,
    error: str | None = None,
) -> None:
    job.status = status
    job.stop_reason = stop_reason
    job.best_step = best_step
    job.best_val_accuracy = best_val_accuracy
    job.step0_val_accuracy = step0_val_accuracy
    job.error = error
    job.finished_at = utcnow()
    job.worker_id = None
    job.lease_expires_at = None
    session.add(job)
    data = {"status": status.value, "stop_reason": stop_reason.value, "best_step": best_step,
            "best_val_accuracy": best_val_accuracy, "step": job.step, "error": error}  # fmt: skip
    append_event(session, job_id=job.id, kind="finished", data=data)


JUDGE_TOTALS = ("judge_responses", "judge_prompt_tokens", "judge_completion_tokens", "judge_cost_usd", "judge_unpriced",
                "judge_groups", "judge_dropped_groups", "judge_attempts", "judge_clamped_scores")  # fmt: skip


def judge_totals(session: Session, *, job_id: str) -> dict[str, float] | None:
    """A job's judge account (service/training/judging.py writes it into each step's metrics), summed over
    its steps; None if no step was judged."""
    judged = [s.metrics for s in steps(session, job_id=job_id) if "judge_groups" in s.metrics]
    if not judged:
        return None
    return {key: sum(float(m.get(key) or 0.0) for m in judged) for key in JUDGE_TOTALS}
