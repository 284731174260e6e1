"""Store the alerts a job's recorded series holds, once each, with an "alert" event beside each."""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_
from sqlmodel import Session, col, select

from service.alerts import window
from service.alerts.rules import Before, Candidate, StepPoint, ValPoint, evaluate
from service.spec import AlertSpec, JobSpec
from service.store import runs
from service.store.events import append_event
from service.store.records import JudgeAccount
from service.store.tables import Alert, Job, TrainingStep


def check_alerts(session: Session, *, job: Job, spec: JobSpec) -> list[Alert]:
    """Run the rules at the job's newest step and validation point (rows pending in ``session`` included) and add
    the alerts not stored yet, each with its event. Returns the new rows (with ids); never commits.

    It reads a window of recent rows whose size the spec bounds (service/alerts/window.py), not the job's
    length, so it finds every alert only when called after each new step row and validation point, as the
    training loop does; the alerts are then the ones the rules give over the whole series."""
    session.flush()
    steps, points, before = _recent(session, job.id, spec.alerts)
    found = evaluate(steps, points, alerts=spec.alerts, validation=spec.validation, before=before)
    candidates = window.fresh(found, newest_step=steps[-1].step if steps else None,
                              newest_point=points[-1].step if points else None)  # fmt: skip
    new = _unstored(session, job.id, candidates)
    session.add_all(new)
    session.flush()  # ids for the events
    for alert in new:
        append_event(session, job_id=job.id, kind="alert", step=alert.step, data=alert_data(alert))
    return new


def _recent(session: Session, job_id: str, alerts: AlertSpec) -> tuple[list[StepPoint], list[ValPoint], Before]:
    """The newest rows of the job's series that decide the alerts at its newest step and point, and what the
    rows before them add up to: three bounded reads."""
    recent = runs.recent_points(session, job_id=job_id, count=window.point_rows(alerts) + 1)
    seed = recent.pop(0) if len(recent) > window.point_rows(alerts) else None  # read for its fold alone
    rows = runs.recent_steps(session, job_id=job_id, count=window.step_rows(alerts),
                             after=recent[0].step if recent else None)  # fmt: skip
    judged = runs.recent_judged_steps(session, job_id=job_id, count=window.judged_rows(alerts))
    steps = [_point(s) for s in rows]
    groups, dropped = _judged_groups(rows[0].totals if rows else {})  # the sums up to the first row read, included
    before = Before(
        progress=runs.progress(seed),
        judge_groups=groups - (steps[0].judge_groups if steps else 0),
        judge_dropped_groups=dropped - (steps[0].judge_dropped_groups if steps else 0),
        judged=tuple(_point(s) for s in judged if not rows or s.step < rows[0].step),
    )
    return steps, [ValPoint(p.step, p.accuracy) for p in recent], before


def _point(s: TrainingStep) -> StepPoint:
    groups, dropped = _judged_groups(s.metrics)
    return StepPoint(s.step, s.reward_mean, s.groups, s.zero_variance_groups, s.kl, groups, dropped, s.judge_agreement)


def _judged_groups(column: dict[str, float]) -> tuple[int, int]:
    """Groups given to the judge and groups it scored none of, as a step's metrics or totals hold them."""
    judge = JudgeAccount.of_column(column)
    return (int(judge.judge_groups), int(judge.judge_dropped_groups)) if judge is not None else (0, 0)


def _unstored(session: Session, job_id: str, candidates: list[Candidate]) -> list[Alert]:
    """Alert rows for the candidates the store does not hold yet; a plateau, once any plateau is stored."""
    if not candidates:
        return []
    query = select(Alert.kind, Alert.step).where(
        Alert.job_id == job_id, or_(col(Alert.step).in_({c.step for c in candidates}), Alert.kind == "plateau")
    )
    stored = set(session.exec(query).all())
    plateaued = any(kind == "plateau" for kind, _ in stored)
    return [
        Alert(job_id=job_id, kind=c.kind, step=c.step, message=c.message, evidence=c.evidence)
        for c in candidates
        if (c.kind, c.step) not in stored and not (c.kind == "plateau" and plateaued)
    ]


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
