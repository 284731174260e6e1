"""Aggregate reads for ``/healthz`` and ``/metrics``: counts by status, live workers, running jobs' accuracy by
environment (never per job: a scrape must not list tenants' job ids).

Each is one small query, cheap enough to run on every scrape. Like every store function they take a
session and keyword arguments and never commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import and_, func
from sqlmodel import Session, col, select

from service.store.runs import POLICY_POINT
from service.store.tables import (
    Alert,
    AlertState,
    Job,
    JobKind,
    JobStatus,
    TrainingStep,
    ValidationPoint,
    WorkerRecord,
    utcnow,
)


@dataclass(frozen=True)
class WorkerSummary:
    alive: int
    capacity: int  # jobs the live workers can train at once
    running_jobs: int


@dataclass(frozen=True)
class RunningAccuracy:
    environment: str
    jobs: int  # running jobs of the environment with a validation point
    latest_mean: float  # mean over those jobs of the accuracy at each one's latest validation point
    best: float  # the best validation accuracy any of them reached so far


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
    """Per environment, the running jobs that have a validation point: how many, their latest accuracy's mean, and
    the best accuracy any reached."""
    running = col(Job.status) == JobStatus.running
    last_step, best = func.max(ValidationPoint.step).label("step"), func.max(ValidationPoint.accuracy).label("best")
    per_job = (
        select(ValidationPoint.job_id, Job.environment, last_step, best)
        .join(Job, col(Job.id) == col(ValidationPoint.job_id))
        .where(running, POLICY_POINT)
        .group_by(ValidationPoint.job_id, Job.environment)
        .subquery()
    )
    joined = and_(col(ValidationPoint.job_id) == per_job.c.job_id, col(ValidationPoint.step) == per_job.c.step)
    environment = per_job.c.environment
    query = (
        select(environment, func.count(), func.avg(ValidationPoint.accuracy), func.max(per_job.c.best))
        .join(per_job, joined)
        .group_by(environment)
        .order_by(environment)
    )
    rows = session.exec(query).all()
    return [RunningAccuracy(environment=name, jobs=n, latest_mean=mean, best=top) for name, n, mean, top in rows]


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
