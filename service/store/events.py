"""A job's event log: lifecycle changes, steps, validation points and alerts, in commit order.

Events are written in the same transaction as the rows they describe, so the log never shows
a step the store does not hold. The event ``id`` is the cursor clients resume a stream from.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from service.store.tables import JobEvent


def append_event(session: Session, *, job_id: str, kind: str, step: int | None = None, data: dict[str, Any] | None = None) -> JobEvent:
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
