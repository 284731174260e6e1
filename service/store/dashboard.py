"""Reads behind the operator dashboard (service/api/routes/ui.py) that the API's own store functions do not cover:
the series of many jobs at once (one query per table, for the jobs page's sparklines) and a job's last event id
(where the job page's live stream starts). Like every store function these take a session and never commit."""

from __future__ import annotations

from collections import defaultdict

from sqlmodel import Session, col, func, select

from service.store.tables import JobEvent, TrainingStep, ValidationPoint

Series = list[tuple[int, float]]  # (step, value), by step


def series_by_job(session: Session, *, job_ids: list[str]) -> dict[str, dict[str, Series]]:
    """Each job's ``val_accuracy`` and ``reward_mean`` series, by step (a job with none recorded: empty lists)."""
    found: dict[str, dict[str, Series]] = {job_id: {"val_accuracy": [], "reward_mean": []} for job_id in job_ids}
    if not job_ids:
        return found
    columns = (
        ("val_accuracy", ValidationPoint, ValidationPoint.accuracy),
        ("reward_mean", TrainingStep, TrainingStep.reward_mean),
    )
    for name, table, value in columns:
        query = select(table.job_id, table.step, value).where(col(table.job_id).in_(job_ids), col(table.step) >= 0)
        rows: dict[str, Series] = defaultdict(list)
        for job_id, step, number in session.exec(query.order_by(col(table.job_id), col(table.step))):
            rows[job_id].append((step, float(number)))
        for job_id, points in rows.items():
            found[job_id][name] = points
    return found


def last_event_id(session: Session, *, job_id: str) -> int:
    """The id of the job's newest event, 0 if it has none: a stream resumed from it sends only what comes next."""
    newest = session.exec(select(func.max(JobEvent.id)).where(JobEvent.job_id == job_id)).one()
    return int(newest or 0)
