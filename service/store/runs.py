"""Data functions for a job's run: create it, record steps and validation points, finish it.

Functions take a session and keyword arguments and never commit: the caller decides what
one transaction is (a step row and the job's progress commit together).
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlmodel import Session, col, delete, select

from service.spec import JobSpec
from service.store.tables import Job, JobStatus, StopReason, TrainingStep, ValidationPoint, utcnow


def create_job(session: Session, *, spec: JobSpec) -> Job:
    job = Job(id=str(uuid.uuid4()), environment=spec.environment, spec=spec.model_dump(mode="json"))
    session.add(job)
    return job


def get_job(session: Session, *, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def mark_running(session: Session, *, job: Job) -> None:
    job.status = JobStatus.running
    job.started_at = job.started_at or utcnow()
    session.add(job)


def record_step(session: Session, *, job: Job, step: int, values: dict[str, Any]) -> TrainingStep:
    row = TrainingStep(job_id=job.id, step=step, **values)
    job.step = step
    session.add_all([row, job])
    return row


def record_validation(session: Session, *, job: Job, step: int, values: dict[str, Any]) -> ValidationPoint:
    row = ValidationPoint(job_id=job.id, step=step, **values)
    session.add(row)
    return row


def steps(session: Session, *, job_id: str) -> list[TrainingStep]:
    return list(session.exec(select(TrainingStep).where(TrainingStep.job_id == job_id).order_by(col(TrainingStep.step))))


def validation_points(session: Session, *, job_id: str) -> list[ValidationPoint]:
    query = select(ValidationPoint).where(ValidationPoint.job_id == job_id).order_by(col(ValidationPoint.step))
    return list(session.exec(query))


def last_recorded_step(session: Session, *, job_id: str) -> int:
    recorded = steps(session, job_id=job_id)
    return recorded[-1].step if recorded else 0


def discard_after(session: Session, *, job: Job, step: int) -> None:
    """Remove step rows and validation points past ``step`` (work the checkpoints no longer hold)."""
    session.exec(delete(TrainingStep).where(col(TrainingStep.job_id) == job.id, col(TrainingStep.step) > step))
    session.exec(delete(ValidationPoint).where(col(ValidationPoint.job_id) == job.id, col(ValidationPoint.step) > step))
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
    session.add(job)
