"""Data functions behind the alerts API: list alerts (per job, per owner or all) and acknowledge one.

The rules that create alerts live in :mod:`service.alerts`; this module only reads and acknowledges.
Like every store function these take a session and keyword arguments and never commit.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from service.store.events import append_event
from service.store.tables import Alert, AlertState, Job, utcnow


def list_alerts(
    session: Session,
    *,
    job_id: str | None = None,
    owner_id: str | None = None,
    state: AlertState | None = None,
    kind: str | None = None,
    limit: int,
    cursor: int | None = None,
) -> tuple[list[Alert], int | None]:
    """A page of alerts, newest first, and the cursor of the next page (None at the end).

    ``job_id`` keeps one job's alerts; ``owner_id`` those of one owner's jobs (None: every owner's);
    ``cursor`` is a ``next_cursor`` from an earlier page (alerts with a smaller id).
    """
    query = select(Alert)
    if job_id is not None:
        query = query.where(Alert.job_id == job_id)
    if owner_id is not None:
        query = query.join(Job, col(Job.id) == col(Alert.job_id)).where(Job.owner_id == owner_id)
    if state is not None:
        query = query.where(Alert.state == state)
    if kind is not None:
        query = query.where(Alert.kind == kind)
    if cursor is not None:
        query = query.where(col(Alert.id) < cursor)
    rows = list(session.exec(query.order_by(col(Alert.id).desc()).limit(limit + 1)))
    page = rows[:limit]
    return page, (page[-1].id if len(rows) > limit else None)


def get_alert(session: Session, *, alert_id: int) -> Alert | None:
    return session.get(Alert, alert_id)


def acknowledge(session: Session, *, alert: Alert, by: str) -> Alert:
    """Mark ``alert`` acknowledged by ``by`` (an operator's id), with an ``alert_acknowledged`` event on
    its job. An alert acknowledged already is left as it is, so acknowledging twice changes nothing."""
    session.refresh(alert, with_for_update=True)  # two operators at once: the second sees the first's
    if alert.state is AlertState.acknowledged:
        return alert
    alert.state, alert.acknowledged_at, alert.acknowledged_by = AlertState.acknowledged, utcnow(), by
    session.add(alert)
    data = {"id": alert.id, "kind": alert.kind, "alert_step": alert.step, "by": by}
    append_event(session, job_id=alert.job_id, kind="alert_acknowledged", data=data)
    return alert
