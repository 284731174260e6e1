"""Store the alerts a job's recorded series holds, once each, with an "alert" event beside each."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, select

from service.alerts.rules import StepPoint, ValPoint, evaluate
from service.spec import JobSpec
from service.store import runs
from service.store.events import append_event
from service.store.tables import Alert, Job


def check_alerts(session: Session, *, job: Job, spec: JobSpec) -> list[Alert]:
    """Run the rules over the job's steps and validation points (rows pending in ``session`` included)
    and add the alerts not stored yet, each with its event. Returns the new rows (with ids); never commits."""
    session.flush()
    rows = runs.steps(session, job_id=job.id)
    steps = [
        StepPoint(s.step, s.reward_mean, s.groups, s.zero_variance_groups, s.kl, int(s.metrics.get("judge_groups") or 0),
                  int(s.metrics.get("judge_dropped_groups") or 0), s.metrics.get("judge_agreement"))  # fmt: skip
        for s in rows
    ]
    points = [ValPoint(p.step, p.accuracy) for p in runs.validation_points(session, job_id=job.id)]
    candidates = evaluate(steps, points, alerts=spec.alerts, validation=spec.validation)
    stored = set(session.exec(select(Alert.kind, Alert.step).where(Alert.job_id == job.id)).all())
    new = [
        Alert(job_id=job.id, kind=c.kind, step=c.step, message=c.message, evidence=c.evidence)
        for c in candidates
        if (c.kind, c.step) not in stored
    ]
    session.add_all(new)
    session.flush()  # ids for the events
    for alert in new:
        append_event(session, job_id=job.id, kind="alert", step=alert.step, data=alert_data(alert))
    return new


def alert_data(alert: Alert) -> dict[str, Any]:
    """An alert as JSON: what its event carries and what the webhook posts."""
    return {
        "id": alert.id,
        "job_id": alert.job_id,
        "kind": alert.kind,
        "step": alert.step,
        "message": alert.message,
        "evidence": alert.evidence,
        "created_at": alert.created_at.isoformat(),
    }
