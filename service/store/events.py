"""A job's event log: lifecycle changes, steps, validation points and alerts, in commit order.

Events are written in the same transaction as the rows they describe, so the log never shows
a step the store does not hold. The event ``id`` is the cursor clients resume a stream from.

That cursor is only safe if ids grow in commit order. PostgreSQL assigns an id at insert, so two
transactions appending to one job could commit out of order, and a reader past the later id would
never see the earlier event. ``append_event`` therefore first locks the job's row: one job's events
are inserted and committed one writer at a time (SQLite serializes all writers already). Every
writer locks at most one job's row per transaction (its own), so the lock adds no deadlock.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from service.store.tables import Job, JobEvent


def append_event(session: Session, *, job_id: str, kind: str, step: int | None = None, data: dict[str, Any] | None = None) -> JobEvent:
    """Add an event to the job's log, holding the job's row until the caller's transaction ends."""
    if session.get_bind().dialect.name != "sqlite":  # SQLite: the writer already holds the database's write lock
        with session.no_autoflush:  # a job created in this session is not flushed early: no one else sees it yet
            session.exec(select(Job.id).where(col(Job.id) == job_id).with_for_update())
    event = JobEvent(job_id=job_id, kind=kind, step=step, data=data or {})
    session.add(event)
    return event


def events_after(session: Session, *, job_id: str, after_id: int = 0, limit: int = 500) -> list[JobEvent]:
    """Events of a job with ``id > after_id``, oldest first."""
    query = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, col(JobEvent.id) > after_id)
        .order_by(col(JobEvent.id))
        .limit(limit)
    )
    return list(session.exec(query))
