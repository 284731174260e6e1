"""Alerts: a job's, every visible one (operators: all; clients: their jobs'), and acknowledging one (operators)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from pydantic import BaseModel, Field
from sqlmodel import Session

from service.alerts.rules import KINDS
from service.api.deps import CallerDep, OperatorDep, SessionDep, visible_job
from service.api.watch_schemas import MAX_ID, AlertList, AlertPublic
from service.store import alerts_query
from service.store.tables import AlertState

router = APIRouter(prefix="/v1", tags=["alerts"])

AlertKind = Enum("AlertKind", {kind: kind for kind in KINDS}, type=str)  # the rules' kinds, named once there


class AlertFilters(BaseModel):
    """The query both alert lists take: what to show, and which page."""

    state: AlertState | None = Field(None, description="Only open or only acknowledged alerts.")
    kind: AlertKind | None = Field(None, description="Only alerts of this kind.")
    limit: int = Field(100, ge=1, le=500, description="Alerts per page.")
    cursor: int | None = Field(None, ge=1, le=MAX_ID, description="`next_cursor` of the previous page.")


FiltersQuery = Annotated[AlertFilters, Query()]


@router.get("/jobs/{job_id}/alerts")
def job_alerts(job_id: str, session: SessionDep, caller: CallerDep, filters: FiltersQuery) -> AlertList:
    """A job's alerts, newest first, each with the numbers that fired it."""
    job = visible_job(session, caller=caller, job_id=job_id)
    return _page(session, job_id=job.id, owner_id=None, filters=filters)


@router.get("/alerts")
def list_alerts(session: SessionDep, caller: CallerDep, filters: FiltersQuery) -> AlertList:
    """Alerts newest first: every job's for operators, a client's own jobs' otherwise (`?state=open`: the inbox)."""
    owner_id = None if caller.is_operator else caller.id
    return _page(session, job_id=None, owner_id=owner_id, filters=filters)


@router.post("/alerts/{alert_id}/ack")
def acknowledge_alert(
    alert_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, caller: OperatorDep
) -> AlertPublic:
    """Acknowledge an alert (operators only). Acknowledging it again returns it unchanged."""
    alert = alerts_query.get_alert(session, alert_id=alert_id)
    if alert is None:
        raise HTTPException(404, f"no alert {alert_id}")
    alerts_query.acknowledge(session, alert=alert, by=caller.id)
    session.commit()
    return AlertPublic.model_validate(alert)


def _page(session: Session, *, job_id: str | None, owner_id: str | None, filters: AlertFilters) -> AlertList:
    rows, next_cursor = alerts_query.list_alerts(
        session, job_id=job_id, owner_id=owner_id, state=filters.state, kind=filters.kind.value if filters.kind else None,
        limit=filters.limit, cursor=filters.cursor,
    )  # fmt: skip
    return AlertList(data=[AlertPublic.model_validate(row) for row in rows], next_cursor=next_cursor)
