"""Job leases and worker records: how many worker processes share one store without sharing a job.

A worker holds a job while ``jobs.lease_expires_at`` is in the future and ``jobs.worker_id``
names it; it renews the lease by heartbeat. A job whose lease ran out (its worker died) can be
claimed again and resumes from its last checkpoint. Time is the database's clock (on SQLite,
this machine's: the only one that can open the file), so workers on different hosts agree.

Like every store function these take a session and keyword arguments and never commit. The
caller commits at once, in its own short transaction: on PostgreSQL a claimed row stays
locked until then, and on SQLite the claim holds the database's write lock.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import ColumnElement, and_, func, or_, update
from sqlmodel import Session, col, select

from service.store.events import append_event
from service.store.tables import Job, JobStatus, WorkerRecord, utcnow

CLAIM_TRIES = 3  # on SQLite a lost race leaves this session holding the write lock, so the next look settles it


def database_now(session: Session) -> datetime:
    """The database's current time, timezone-aware UTC."""
    if session.get_bind().dialect.name == "sqlite":
        return utcnow()
    return session.exec(select(func.now())).one().astimezone(timezone.utc)


def _claimable(now: datetime) -> ColumnElement[bool]:
    """Queued, or running under a lease that expired. A running job with no lease at all belongs to a
    process that does not lease (``artsvc train``) and is never taken from it."""
    expired = col(Job.lease_expires_at) < now  # NULL (no lease) is never less than anything
    return or_(col(Job.status) == JobStatus.queued, and_(col(Job.status) == JobStatus.running, expired))


def claim_next(session: Session, *, worker_id: str, lease_seconds: float) -> Job | None:
    """Claim the oldest claimable job for ``worker_id`` (running, leased, attempts + 1), or None.

    The oldest candidate is read ``FOR UPDATE SKIP LOCKED`` (PostgreSQL locks it and other claimers
    pass over it; SQLite ignores the clause), then updated only if it is still claimable: on SQLite,
    which has no row locks, that conditional UPDATE is what keeps two processes from both winning.
    """
    for _ in range(CLAIM_TRIES):
        now = database_now(session)
        oldest = (
            select(Job.id)
            .where(_claimable(now))
            .order_by(col(Job.created_at), col(Job.id))
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        job_id = session.exec(oldest).first()
        if job_id is None:
            return None
        claim = (
            update(Job)
            .where(col(Job.id) == job_id, _claimable(now))
            .values(
                status=JobStatus.running,
                worker_id=worker_id,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                attempts=col(Job.attempts) + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if session.exec(claim).rowcount == 1:
            return session.get(Job, job_id, populate_existing=True)
    return None


def _held_by(job_id: str, worker_id: str) -> tuple[ColumnElement[bool], ...]:
    return col(Job.id) == job_id, col(Job.worker_id) == worker_id, col(Job.status) == JobStatus.running


def renew(session: Session, *, job_id: str, worker_id: str, lease_seconds: float) -> bool:
    """Extend ``worker_id``'s lease on a running job; False if it lost the job (taken over, or ended)."""
    now = database_now(session)
    extend = (
        update(Job)
        .where(*_held_by(job_id, worker_id))
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False)
    )
    return session.exec(extend).rowcount == 1


def release(session: Session, *, job_id: str, worker_id: str) -> bool:
    """Give a running job back to the queue (graceful shutdown) so another worker resumes it at once.

    False, changing nothing, if ``worker_id`` no longer holds it.
    """
    give_back = (
        update(Job)
        .where(*_held_by(job_id, worker_id))
        .values(status=JobStatus.queued, worker_id=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    if session.exec(give_back).rowcount != 1:
        return False
    job = session.get(Job, job_id, populate_existing=True)
    append_event(session, job_id=job_id, kind="queued", data={"released_by": worker_id, "step": job.step})
    return True


def register_worker(session: Session, *, worker_id: str, hostname: str, pid: int, concurrency: int) -> WorkerRecord:
    """Record a worker process as started (or restarted under the same id) and alive now."""
    now = database_now(session)
    values = dict(hostname=hostname, pid=pid, concurrency=concurrency, running_jobs=0, started_at=now, heartbeat_at=now)
    record = session.get(WorkerRecord, worker_id) or WorkerRecord(id=worker_id, **values)
    record.sqlmodel_update({**values, "stopped_at": None})
    session.add(record)
    return record


def heartbeat_worker(session: Session, *, worker_id: str, running_jobs: int) -> None:
    """Mark the worker alive now, running ``running_jobs`` jobs."""
    record = _worker(session, worker_id)
    record.heartbeat_at = database_now(session)
    record.running_jobs = running_jobs
    session.add(record)


def stop_worker(session: Session, *, worker_id: str) -> None:
    """Mark the worker stopped (a clean exit; a killed worker just stops heartbeating)."""
    record = _worker(session, worker_id)
    record.stopped_at = record.heartbeat_at = database_now(session)
    record.running_jobs = 0
    session.add(record)


def _worker(session: Session, worker_id: str) -> WorkerRecord:
    record = session.get(WorkerRecord, worker_id)
    if record is None:
        raise LookupError(f"no worker {worker_id!r}: register it first")
    return record
