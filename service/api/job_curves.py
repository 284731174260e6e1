"""A job's curves from the store: its steps, validation points and alerts read through the API's own schemas, then
drawn by :mod:`service.curves`, so ``GET /v1/jobs/{id}/curves.png`` and ``artsvc plot --local`` give the same bytes."""

from __future__ import annotations

from sqlmodel import Session

from service.api.schemas import StepPublic, ValidationPublic
from service.api.watch_schemas import AlertPublic
from service.curves import render_curves
from service.store import alerts_query, runs
from service.store.tables import Job

ALERT_PAGE = 500


def job_curves(session: Session, *, job: Job) -> bytes:
    """``job``'s curves from the store, read through the API's own schemas so every caller draws the same."""
    steps = [StepPublic.model_validate(row).model_dump(mode="json") for row in runs.steps(session, job_id=job.id)]
    points = runs.validation_points(session, job_id=job.id, with_base=True)
    validation = [ValidationPublic.model_validate(row).model_dump(mode="json") for row in points]
    alerts, cursor = [], None
    while True:
        rows, cursor = alerts_query.list_alerts(session, job_id=job.id, limit=ALERT_PAGE, cursor=cursor)
        alerts += [AlertPublic.model_validate(row).model_dump(mode="json") for row in rows]
        if cursor is None:
            break
    alerts.sort(key=lambda alert: (alert["step"], alert["id"]))  # the API pages newest first
    title = f"{job.environment} job {job.id[:8]} ({job.status.value}, step {job.step})"
    return render_curves(steps, validation, alerts, title=title)
