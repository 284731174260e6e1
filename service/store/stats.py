"""Aggregate reads for ``/healthz`` and ``/metrics``: counts by status, live workers, running jobs' accuracy.

Each is one small query, cheap enough to run on every scrape. Like every store function they take a
session and keyword arguments and never commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import and_, func
from sqlmodel import Session, col, select

from service.store.tables import Alert, AlertState, Job, JobKind, JobStatus, TrainingStep, ValidationPoint, WorkerRecord, utcnow


@dataclass(frozen=True)
class WorkerSummary:
    alive: int
    capacity: int  # jobs the live workers can train at once
    running_jobs: int


@dataclass(frozen=True)
class RunningAccuracy:
    job_id: str
    latest: float  # validation accuracy at the job's latest validation point
    best: float


def job_counts(session: Session) -> dict[tuple[JobKind, JobStatus], int]:
    """Jobs per kind (training, evaluation) and status, every pair present (0 for none)."""
    rows = session.exec(select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)).all()
    counts = {(JobKind(kind), JobStatus(status)): n for kind, status, n in rows}
    return {(kind, status): counts.get((kind, status), 0) for kind in JobKind for status in JobStatus}


def training_steps(session: Session) -> int:
    """Training step rows recorded, over every job."""
    return session.exec(select(func.count()).select_from(TrainingStep)).one()


def alert_counts(session: Session) -> dict[tuple[str, str], int]:
    """Alerts per (kind, state) that has any."""
    rows = session.exec(select(Alert.kind, Alert.state, func.count()).group_by(Alert.kind, Alert.state)).all()
    return {(kind, AlertState(state).value): count for kind, state, count in rows}


def running_accuracy(session: Session) -> list[RunningAccuracy]:
    """Latest and best validation accuracy of every running job that has a validation point."""
    running = col(Job.status) == JobStatus.running
    last_step, best = func.max(ValidationPoint.step).label("step"), func.max(ValidationPoint.accuracy).label("best")
    per_job = (
        select(ValidationPoint.job_id, last_step, best)
        .join(Job, col(Job.id) == col(ValidationPoint.job_id))
        .where(running)
        .group_by(ValidationPoint.job_id)
        .subquery()
    )
    latest = select(ValidationPoint.job_id, ValidationPoint.accuracy, per_job.c.best).join(
        per_job, and_(col(ValidationPoint.job_id) == per_job.c.job_id, col(ValidationPoint.step) == per_job.c.step)
    )
    rows = session.exec(latest.order_by(col(ValidationPoint.job_id))).all()
    return [RunningAccuracy(job_id=job_id, latest=accuracy, best=best) for job_id, accuracy, best in rows]


def workers(session: Session, *, lease_seconds: float) -> WorkerSummary:
    """The live workers: not stopped, and heartbeating within two lease periods of the database's clock
    (a worker renews its leases well within one, so missing two means it is gone)."""
    cutoff = _database_now(session) - timedelta(seconds=2 * lease_seconds)
    alive = col(WorkerRecord.stopped_at).is_(None), col(WorkerRecord.heartbeat_at) >= cutoff
    query = select(func.count(), func.sum(WorkerRecord.concurrency), func.sum(WorkerRecord.running_jobs)).where(*alive)
    count, capacity, running = session.exec(query).one()
    return WorkerSummary(alive=count, capacity=capacity or 0, running_jobs=running or 0)


def _database_now(session: Session) -> datetime:
    """The database's clock, which workers' heartbeats are written by (on SQLite, this machine's)."""
    if session.get_bind().dialect.name == "sqlite":
        return utcnow()
    return session.exec(select(func.now())).one().astimezone(timezone.utc)
