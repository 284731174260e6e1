"""Jobs: submit (idempotently), list, read, cancel, and read a job's metrics and sampled rollouts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response

from service import submission
from service.api.deps import BearerDep, CallerDep, SessionDep, SettingsDep, read_now, visible_job, visible_job_now
from service.api.errors import ErrorBody
from service.api.schemas import (
    CostPublic,
    JobList,
    JobPublic,
    JudgeTotals,
    MetricsPublic,
    StepPublic,
    TrajectoryList,
    TrajectoryPublic,
    ValidationPublic,
)
from service.api.threads import in_request_thread
from service.spec import JobSpec
from service.store import jobs, running, runs
from service.store.tables import JobKind, JobStatus

router = APIRouter(prefix="/v1", tags=["jobs"])

MAX_STEP = 2**31 - 1  # step columns are 32-bit integers
ENDED = {409: {"model": ErrorBody, "description": "The job already ended."}}
REPLAYED = {"description": "`true` when an earlier request with this key made the job.", "schema": {"type": "string"}}


@router.post(
    "/jobs",
    status_code=201,
    responses={
        201: {
            "description": "The queued job, or the job an earlier request with the same `Idempotency-Key` made.",
            "headers": {"Idempotent-Replayed": REPLAYED},
        },
        409: {"model": ErrorBody, "description": "The idempotency key was used with a different spec."},
        429: {"model": ErrorBody, "description": "The token has as many jobs queued as this server allows."},
    },
)
async def submit_job(
    spec: JobSpec,
    request: Request,
    session: SessionDep,
    caller: CallerDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            pattern=r"^[\x20-\x7e]{1,255}$",  # printable ASCII: stored as given on every database
            description="Up to 255 printable ASCII characters; retries with the same key and spec get the same job.",
        ),
    ] = None,
) -> JobPublic:
    """Queue a training job. A retry with the same `Idempotency-Key` returns the first job (with header
    `Idempotent-Replayed: true`); the same key with a different spec is refused with 409. A client token is held to
    the backends, base models and queue length the operator allows (422, 429); every token to the per-job limits."""
    job = submission.prepare(spec, caller=caller, settings=settings, idempotency_key=idempotency_key)
    # on the loop if SQLite's write lock is free this instant, else on one request thread (service/api/loop_writes.py)
    queued = request.app.state.loop_writes.try_now(submission.queue_once, job, caller=caller, settings=settings)
    if queued is None:
        queued = await in_request_thread(request.app.state.request_threads, submission.queue_in_turn, session, job,
                                         caller=caller, settings=settings)  # fmt: skip
    job, replayed = queued
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return JobPublic.model_validate(job)


@router.get("/jobs")
async def list_jobs(
    request: Request,
    caller: CallerDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Jobs per page.")] = 50,
    cursor: Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page.")] = None,
) -> JobList:
    """Jobs newest first: a client's own, every job for operators."""
    owner_id = None if caller.is_operator else caller.id
    try:
        page, next_cursor = read_now(request, jobs.list_jobs, owner_id=owner_id, status=status, limit=limit, cursor=cursor)
    except jobs.BadCursor as exc:
        raise HTTPException(400, str(exc)) from None
    return JobList(data=[JobPublic.model_validate(job) for job in page], next_cursor=next_cursor)


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, request: Request, credentials: BearerDep) -> JobPublic:
    """One job: status, current step, best step and accuracy, stop reason, error."""
    return JobPublic.model_validate(await visible_job_now(request, credentials, job_id=job_id))


@router.post("/jobs/{job_id}/cancel", responses=ENDED)
def cancel_job(job_id: str, session: SessionDep, caller: CallerDep) -> JobPublic:
    """Cancel a job (its owner or an operator): a queued job ends at once, a running one at its next
    step boundary, with stop reason `cancelled`. A training job of ART's client (`/v1/preview/training-jobs`) is
    cancelled here too (its client reads `training_failed`), and cancelling a client model's series ends the model's
    training."""
    job = visible_job(session, caller=caller, job_id=job_id, kind=None)
    if job.kind == JobKind.evaluation:  # cancelled at /v1/evaluations/{id}/cancel
        raise HTTPException(404, f"no job {job_id[:64]!r}")
    try:
        jobs.request_cancel(session, job=job, requested_by=caller.id)
    except jobs.JobEnded as exc:
        raise HTTPException(409, str(exc)) from None
    session.commit()
    return JobPublic.model_validate(job)


@router.get("/jobs/{job_id}/metrics")
def get_metrics(job_id: str, session: SessionDep, caller: CallerDep) -> MetricsPublic:
    """Every training step's metrics and every validation point, in step order (the base model's first, at step -1,
    where the job had a warm start)."""
    job = visible_job(session, caller=caller, job_id=job_id)
    recorded, points = runs.steps(session, job_id=job.id), runs.validation_points(session, job_id=job.id, with_base=True)
    unrecorded = runs.unrecorded_judging(session, job_id=job.id)  # judging of steps cut short (a budget spent)
    totals = recorded[-1].totals if recorded else {}  # the running sums of the newest step
    judge = running.judge_totals(totals, unrecorded)
    return MetricsPublic(
        steps=[StepPublic.model_validate(row) for row in recorded],
        validation=[ValidationPublic.model_validate(row) for row in points],
        judge=JudgeTotals(**judge) if judge else None,
        cost=CostPublic(**runs.cost_of(totals, points, unrecorded)),
    )


@router.get("/jobs/{job_id}/trajectories")
def get_trajectories(
    job_id: str,
    session: SessionDep,
    caller: CallerDep,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="Only rollouts of this step.")] = None,
    split: Annotated[Literal["train", "val"] | None, Query(description="Only training or validation rollouts.")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Rollouts at most.")] = 50,
) -> TrajectoryList:
    """Sampled rollouts with their messages, reward and the scorer's details, newest step first."""
    job = visible_job(session, caller=caller, job_id=job_id)
    rows = jobs.trajectories(session, job_id=job.id, step=step, split=split, limit=limit)
    return TrajectoryList(data=[TrajectoryPublic.model_validate(row) for row in rows])


@router.get("/jobs/{job_id}/manifest")
def get_manifest(job_id: str, session: SessionDep, caller: CallerDep) -> dict[str, Any]:
    """What a job or an evaluation measured with: split fingerprints, environment and scorer versions, prompt hash,
    sampling, backend and base model, judge, seed, code version. `locked` holds what two runs must share to be
    compared (GET /v1/compare)."""
    job = visible_job(session, caller=caller, job_id=job_id, kind=None)
    if job.manifest is None:
        raise HTTPException(404, f"job {job.id} has no manifest yet")
    return job.manifest
