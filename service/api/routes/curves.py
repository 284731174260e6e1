"""A job's training curves as a PNG, for a browser or ``artsvc plot``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import CallerDep, SessionDep, visible_job
from service.api.job_curves import job_curves

router = APIRouter(prefix="/v1", tags=["jobs"])

PNG = {200: {"content": {"image/png": {}}, "description": "Reward, validation accuracy, KL, entropy and completion "
                                                          "length over steps, each alert marked where it fired."}}


@router.get("/jobs/{job_id}/curves.png", response_class=Response, responses=PNG)
def get_curves(job_id: str, session: SessionDep, caller: CallerDep) -> Response:
    """The job's curves drawn now from its recorded steps, validation points and alerts (never cached:
    a running job's picture changes with every step)."""
    job = visible_job(session, caller=caller, job_id=job_id)
    return Response(job_curves(session, job=job), media_type="image/png", headers={"Cache-Control": "no-store"})
