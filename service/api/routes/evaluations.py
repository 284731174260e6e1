"""Evaluations (measurement only) and the promotion gate that compares two measured runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from sqlmodel import Session

from service import submission
from service.api.deps import CallerDep, SessionDep, SettingsDep, visible_job
from service.api.errors import ErrorBody
from service.api.schemas import (
    ComparisonPublic,
    EvaluationList,
    EvaluationPublic,
    ExampleResultList,
    ExampleResultPublic,
)
from service.api.threads import in_request_thread
from service.auth import Principal
from service.evaluation.compare import Measured, compare
from service.settings import Settings
from service.spec import CheckpointModel, EvaluationSpec
from service.store import jobs, runs
from service.store.tables import Job, JobKind, JobStatus

router = APIRouter(prefix="/v1", tags=["evaluations"])

MAX_STEP = 2**31 - 1


@router.post(
    "/evaluations",
    status_code=201,
    responses={
        409: {"model": ErrorBody, "description": "The evaluated job has not ended."},
        429: {"model": ErrorBody, "description": "The token has as many jobs queued as this server allows."},
    },
)
async def submit_evaluation(
    spec: EvaluationSpec, request: Request, session: SessionDep, caller: CallerDep, settings: SettingsDep
) -> EvaluationPublic:
    """Queue an evaluation: a job's checkpoint (its best step unless `step` is given) or a litellm model the
    operator allows, on a split, with `n` samples per example (best-of-N selection above 1). A client token may have
    as many jobs and evaluations queued as the operator allows (429 beyond)."""
    # async, with one thread hop (service/api/deps.py); never on the loop: resolving it reads checkpoints from disk
    threads = request.app.state.request_threads
    return await in_request_thread(threads, _queue_evaluation, session, spec, caller=caller, settings=settings)


def _queue_evaluation(
    session: Session, spec: EvaluationSpec, *, caller: Principal, settings: Settings
) -> EvaluationPublic:
    if isinstance(spec.model, CheckpointModel):
        visible_job(session, caller=caller, job_id=spec.model.job_id)  # 404 for another tenant's job, as for none
    job = submission.submit_evaluation(session, spec, caller=caller, settings=settings)
    return EvaluationPublic.model_validate(job)


@router.get("/evaluations")
def list_evaluations(
    session: SessionDep,
    caller: CallerDep,
    status: Annotated[JobStatus | None, Query(description="Only evaluations in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> EvaluationList:
    """Evaluations newest first: a client's own, every one for operators."""
    owner_id = None if caller.is_operator else caller.id
    try:
        page, next_cursor = jobs.list_jobs(session.connection(), owner_id=owner_id, status=status, limit=limit, cursor=cursor,
                                           kind=JobKind.evaluation)  # fmt: skip
    except jobs.BadCursor as exc:
        raise HTTPException(400, str(exc)) from None
    return EvaluationList(data=[EvaluationPublic.model_validate(job) for job in page], next_cursor=next_cursor)


@router.get("/evaluations/{evaluation_id}")
def get_evaluation(evaluation_id: str, session: SessionDep, caller: CallerDep) -> EvaluationPublic:
    """One evaluation: its status and, once it has succeeded, its summary."""
    return EvaluationPublic.model_validate(visible_job(session, caller=caller, job_id=evaluation_id, kind=JobKind.evaluation))


@router.post(
    "/evaluations/{evaluation_id}/cancel",
    responses={409: {"model": ErrorBody, "description": "The evaluation already ended."}},
)
def cancel_evaluation(evaluation_id: str, session: SessionDep, caller: CallerDep) -> EvaluationPublic:
    """Cancel an evaluation: a queued one ends at once, a running one within a tenth of its rollouts; it records
    no results."""
    job = visible_job(session, caller=caller, job_id=evaluation_id, kind=JobKind.evaluation)
    try:
        jobs.request_cancel(session, job=job, requested_by=caller.id)
    except jobs.JobEnded as exc:
        raise HTTPException(409, str(exc).replace("job", "evaluation", 1)) from None
    session.commit()
    return EvaluationPublic.model_validate(job)


@router.get("/evaluations/{evaluation_id}/results")
def get_evaluation_results(
    evaluation_id: str,
    session: SessionDep,
    caller: CallerDep,
    outcome: Annotated[str | None, Query(max_length=64, description="Only examples with this outcome code.")] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> ExampleResultList:
    """Per-example results in split order: outcome code, the (selected) completion, reward and details."""
    job = visible_job(session, caller=caller, job_id=evaluation_id, kind=JobKind.evaluation)
    rows = [r for r in runs.example_results(session, job_id=job.id, step=0) if outcome in (None, r.outcome)]
    return ExampleResultList(data=[ExampleResultPublic.model_validate(r) for r in rows[offset : offset + limit]])


def _measured(session: Session, caller: Principal, job_id: str, step: int | None) -> Measured:
    job: Job = visible_job(session, caller=caller, job_id=job_id, kind=None)
    if step is None:
        step = 0 if job.kind == JobKind.evaluation else (job.best_step if job.best_step is not None else job.step)
    return Measured(id=job.id, kind=job.kind, step=step, manifest=job.manifest,
                    results=runs.example_results(session, job_id=job.id, step=step))  # fmt: skip


@router.get("/compare")
def compare_runs(
    session: SessionDep,
    caller: CallerDep,
    baseline: Annotated[str, Query(max_length=64, description="A job or evaluation id.")],
    candidate: Annotated[str, Query(max_length=64, description="A job or evaluation id.")],
    min_delta: Annotated[float, Query(ge=-1, le=1, description="Accuracy gain the interval's lower bound must clear.")] = 0.0,
    confidence: Annotated[float, Query(ge=0.5, le=0.999, description="Of the bootstrap intervals.")] = 0.95,
    resamples: Annotated[int, Query(ge=100, le=20_000, description="Bootstrap resamples.")] = 2000,
    baseline_step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="A job's validation step; default its best.")] = None,
    candidate_step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="A job's validation step; default its best.")] = None,
) -> ComparisonPublic:
    """ACCEPT or REJECT a candidate against a baseline. REJECT with every differing manifest field when the two were
    not measured the same way (the Locked Room rule); otherwise the accuracy delta with a paired bootstrap interval,
    overall and per outcome code, gated by `min_delta` and by any failure outcome that rose."""
    verdict = compare(_measured(session, caller, baseline, baseline_step), _measured(session, caller, candidate, candidate_step),
                      min_delta=min_delta, confidence=confidence, resamples=resamples)  # fmt: skip
    return ComparisonPublic.model_validate(verdict)
