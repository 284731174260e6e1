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

from sqlalchemy import ColumnElement, ScalarSelect, and_, case, exists, func, or_, update
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from service.store import queue_signal, runs
from service.store.events import append_event
from service.store.tables import ApiToken, Job, JobKind, JobStatus, Role, StopReason, WorkerRecord, utcnow

CLAIM_TRIES = 3  # on SQLite a lost race leaves this session holding the write lock, so the next look settles it


def database_now(session: Session) -> datetime:
    """The database's current time, timezone-aware UTC."""
    if session.get_bind().dialect.name == "sqlite":
        return utcnow()
    return session.exec(select(func.now())).one().astimezone(timezone.utc)


def _claimable(now: datetime) -> ColumnElement[bool]:
    """Queued, or running under a lease that expired. A running job with no lease at all belongs to a
    process that does not lease (``artsvc train``, a client model's series) and is never taken from it. A client's
    batch waits while its model has another batch running or queued before it: a model takes its steps in order."""
    expired = col(Job.lease_expires_at) < now  # NULL (no lease) is never less than anything
    claimable = or_(col(Job.status) == JobStatus.queued, and_(col(Job.status) == JobStatus.running, expired))
    return and_(claimable, or_(col(Job.kind) != JobKind.client_batch, ~_batch_ahead()))


def _batch_ahead() -> ColumnElement[bool]:
    """Another batch of the same model that is running, or queued before this one."""
    other = aliased(Job)
    before = or_(col(other.created_at) < col(Job.created_at),
                 and_(col(other.created_at) == col(Job.created_at), col(other.id) < col(Job.id)))  # fmt: skip
    return exists().where(
        col(other.parent_id) == col(Job.parent_id), col(other.kind) == JobKind.client_batch,
        col(other.id) != col(Job.id),
        or_(col(other.status) == JobStatus.running, and_(col(other.status) == JobStatus.queued, before)),
    )  # fmt: skip


def any_claimable(session: Session) -> bool:
    """Whether some job could be claimed now (tenant caps aside): what makes a worker import its runners."""
    return session.exec(select(Job.id).where(_claimable(database_now(session))).limit(1)).first() is not None


def claim_next(
    session: Session, *, worker_id: str, lease_seconds: float, max_running_per_tenant: int, max_attempts: int
) -> Job | None:
    """Claim a job for ``worker_id`` (running, leased, attempts + 1), or None: of the tenants with claimable jobs,
    the one running the fewest now, its oldest job. A client tenant running ``max_running_per_tenant`` jobs waits;
    operators' jobs and local ones (``artsvc train``, local mode) are not capped. Claimable jobs already claimed
    ``max_attempts`` times fail instead (``give_up_exhausted``).

    The candidate is read ``FOR UPDATE SKIP LOCKED`` (PostgreSQL locks it and other claimers pass over it; SQLite
    ignores the clause), then updated only if it is still claimable and its tenant still under its cap: on SQLite,
    which has no row locks, that conditional UPDATE (under the database's write lock) is what keeps two processes
    from both winning; on PostgreSQL the tenant's token row is locked first, so claimers of one tenant count in turn.
    """
    give_up_exhausted(session, max_attempts=max_attempts)
    for _ in range(CLAIM_TRIES):
        now = database_now(session)
        running, clients = _running_by_tenant(session, now)
        capped = [owner for owner in clients if running[owner] >= max_running_per_tenant]
        fewest_running_first = [case(running, value=col(Job.owner_id), else_=0)] if running else []
        candidate = (
            select(Job.id, Job.owner_id, ApiToken.role)
            .outerjoin(ApiToken, col(ApiToken.id) == col(Job.owner_id))
            .where(_claimable(now), col(Job.owner_id).not_in(capped))
            .order_by(*fewest_running_first, col(Job.created_at), col(Job.id))
            .limit(1)
            .with_for_update(skip_locked=True, of=Job)
        )
        found = session.exec(candidate).first()
        if found is None:
            return None
        job_id, owner_id, role = found
        conditions = [col(Job.id) == job_id, _claimable(now)]
        if role == Role.client:  # lock its token row (SQLite ignores FOR UPDATE: its UPDATE below locks everything)
            session.exec(select(ApiToken.id).where(col(ApiToken.id) == owner_id).with_for_update())
            conditions.append(_running_of(owner_id, now) < max_running_per_tenant)
        claim = (
            update(Job)
            .where(*conditions)
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


def give_up_exhausted(session: Session, *, max_attempts: int) -> list[str]:
    """End every claimable job already claimed ``max_attempts`` times, so that a job which kills its worker is not
    retried forever: failed (stop reason error, a ``finished`` event), or cancelled if its owner or an operator asked
    for that meanwhile (what was asked is what the job ends as, not how its workers died); their ids."""
    now = database_now(session)
    exhausted = _claimable(now), col(Job.attempts) >= max_attempts
    ended = []
    for job_id in session.exec(select(Job.id).where(*exhausted).with_for_update(skip_locked=True)).all():
        mark = update(Job).where(col(Job.id) == job_id, *exhausted).values(status=JobStatus.failed)
        if session.exec(mark.execution_options(synchronize_session=False)).rowcount != 1:
            continue  # another claimer ended it first
        job = session.get(Job, job_id, populate_existing=True)
        if job.cancel_requested:
            status, stop_reason, error = JobStatus.cancelled, StopReason.cancelled, None
        else:
            status, stop_reason = JobStatus.failed, StopReason.error
            error = (f"gave up after {job.attempts} attempts: each time its worker died or lost the lease before the "
                     "job ended (ARTSVC_MAX_ATTEMPTS)")  # fmt: skip
        runs.finish_job(session, job=job, status=status, stop_reason=stop_reason, error=error,
                        best_step=job.best_step, best_val_accuracy=job.best_val_accuracy,
                        step0_val_accuracy=job.step0_val_accuracy, base_val_accuracy=job.base_val_accuracy)  # fmt: skip
        ended.append(job_id)
    return ended


def _held(jobs: type[Job], now: datetime) -> tuple[ColumnElement[bool], ...]:
    """Running under a live lease: what counts against a tenant's running cap (a baseline evaluation, run without a
    lease inside its training job, does not count twice)."""
    return col(jobs.status) == JobStatus.running, col(jobs.lease_expires_at) >= now


def _running_by_tenant(session: Session, now: datetime) -> tuple[dict[str, int], set[str]]:
    """Jobs running now per owner, and which of those owners are client tokens (the capped ones)."""
    query = (
        select(Job.owner_id, func.count(), ApiToken.role)
        .outerjoin(ApiToken, col(ApiToken.id) == col(Job.owner_id))
        .where(*_held(Job, now))
        .group_by(col(Job.owner_id), col(ApiToken.role))
    )
    rows = session.exec(query).all()
    return {owner: count for owner, count, _ in rows}, {owner for owner, _, role in rows if role == Role.client}


def _running_of(owner_id: str, now: datetime) -> ScalarSelect[int]:
    """How many jobs ``owner_id`` runs now, read when the claiming UPDATE runs."""
    others = aliased(Job)
    mine = col(others.owner_id) == owner_id, *_held(others, now)
    return select(func.count()).select_from(others).where(*mine).scalar_subquery()


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
    """Give a running job back to the queue (graceful shutdown) so another worker resumes it at once; the claim is
    given back too, so rolling restarts do not use up the job's ``max_attempts``.

    False, changing nothing, if ``worker_id`` no longer holds it.
    """
    give_back = (
        update(Job)
        .where(*_held_by(job_id, worker_id))
        .values(status=JobStatus.queued, worker_id=None, lease_expires_at=None, attempts=col(Job.attempts) - 1)
        .execution_options(synchronize_session=False)
    )
    if session.exec(give_back).rowcount != 1:
        return False
    job = session.get(Job, job_id, populate_existing=True)
    append_event(session, job_id=job_id, kind="queued", data={"released_by": worker_id, "step": job.step})
    queue_signal.announce(session)
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
