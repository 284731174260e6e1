"""``/v1/preview``: the training protocol of ART's own client (``art.ServerlessBackend(base_url=".../v1",
api_key=TOKEN)``), so an unmodified ART script registers a model, posts its trajectory groups and reads the steps
back (../shared/ART-CLIENT-PROTOCOL.md; service/art_client). This service's tokens are the API keys; a model is its
token's, and another tenant's is a 404 everywhere, as an unknown one. Refusals are in OpenAI's error envelope, which
ART's client unwraps into its exceptions: 422 a malformed body (naming the first bad field), 404 no such model or
training job of yours, 409 a conflict, 413 a body past its limit.

Lists are pages ``{"data", "has_more"}``; the client asks again with ``after`` set to the last item's id.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, StrictBool, StrictInt
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select
from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse

from service import tenancy
from service.api.deps import CallerDep, EngineDep, SessionDep, SettingsDep
from service.api.errors import ErrorBody
from service.api.routes.events import FreesItsSlot, StreamSlots
from service.api.routes.inference import OpenAIRoute
from service.api.schemas import OpenAIErrorBody
from service.api.threads import in_request_thread
from service.art_client import EVENT_KINDS, batches, names, registry
from service.auth import Principal
from service.backends import layout
from service.settings import Settings
from service.spec import ValidationSpec
from service.store import runs
from service.store.events import append_event
from service.store.tables import ClientModel, Job, JobEvent, JobKind, JobStatus, StopReason, utcnow

PAGE_LIMIT = 1000  # most items a page holds, whatever ``limit`` asks
EVENTS_HOLD_S = 10.0  # how long an events request waits for its job to end, well within clients' read timeouts
EVENTS_CHECK_S = 0.1  # how often a held events request reads the store
ENDING_KINDS = ("training_ended", "training_failed")
MAX_STEPS_PER_DELETE = 10_000
NAME = names.PART.pattern


class PreviewRoute(OpenAIRoute):
    """Refusals in OpenAI's error envelope, a malformed body a 422 (as ART's protocol answers it)."""

    validation_status = 422
    codes = {401: "invalid_api_key", 404: "not_found", 409: "conflict", 413: "request_too_large",
             422: "invalid_request", 429: "rate_limit_exceeded"}  # fmt: skip


RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": OpenAIErrorBody, "description": "Refused, in OpenAI's error envelope: 401 no or a wrong token, "
            "404 no such model or training job of yours, 409 a conflict, 422 a malformed request."},
    413: {"model": ErrorBody, "description": "The body is larger than ARTSVC_MAX_BODY_BYTES (a training job's: "
          "ARTSVC_CLIENT_BATCH_MAX_BYTES)."},
    429: {"model": ErrorBody | OpenAIErrorBody, "description": "Too many requests of this credential in progress "
          "(`detail`), or too many jobs queued (OpenAI's envelope); retry after `Retry-After` seconds."},
}  # fmt: skip
router = APIRouter(prefix="/v1/preview", tags=["ART client"], route_class=PreviewRoute, responses=RESPONSES)


class ModelCreate(BaseModel):
    entity: str | None = Field(None, pattern=NAME)
    project: str = Field(pattern=NAME)
    name: str = Field(pattern=NAME)
    base_model: str = Field(min_length=1, max_length=255)
    return_existing: StrictBool = True
    validation: ValidationSpec | None = Field(
        None, description="This server's own: how a model whose project names an installed environment is validated "
        "(a job's `validation`; its defaults when unset). ART's client sends none.",
    )  # fmt: skip


class ModelPublic(BaseModel):
    id: str
    entity: str
    project: str
    name: str
    base_model: str
    run_id: str | None = Field(None, description="The job holding the model's series (GET /v1/jobs/{id}).")


class CheckpointPublic(BaseModel):
    id: str = Field(description="The step, as text (the cursor of `after`).")
    step: int
    metrics: dict[str, float]


class CheckpointPage(BaseModel):
    data: list[CheckpointPublic]
    has_more: bool


class CheckpointsDelete(BaseModel):
    steps: list[Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]] = Field(max_length=MAX_STEPS_PER_DELETE)


class CheckpointsDeleted(BaseModel):
    deleted_count: int
    not_found_steps: list[int]


class TrainingJobCreated(BaseModel):
    id: str


class EventPublic(BaseModel):
    id: str
    type: str
    data: dict[str, Any]


class EventPage(BaseModel):
    data: list[EventPublic]
    has_more: bool


@router.post("/models", response_model=ModelPublic)
def register_model(body: ModelCreate, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> ModelPublic:
    """Register a model (`return_existing`: the caller's model of that name if it exists). Its base model must be one
    the operator lets this token train (ARTSVC_CLIENT_BASE_MODELS), as for jobs. A `project` named as an installed
    environment (GET /v1/environments) makes a validated model: each due checkpoint is validated on that
    environment's val split, and the model stops by a job's rules (plateau, target, divergence, max steps), after
    which it takes no more training jobs."""
    entity = body.entity or registry.DEFAULT_ENTITY
    if not body.return_existing and registry.find(session, owner_id=caller.id, entity=entity, project=body.project,
                                                  name=body.name):  # fmt: skip
        raise HTTPException(409, f"model {body.project}/{body.name} exists (return_existing is false)")
    try:
        registered = registry.register(session, caller=caller, entity=body.entity, project=body.project,
                                       name=body.name, base_model=body.base_model, settings=settings,
                                       validation=body.validation)  # fmt: skip
    except (registry.NotAllowed, registry.InvalidModel) as exc:
        raise HTTPException(422, str(exc)) from None
    except registry.BaseModelMismatch as exc:
        raise HTTPException(409, str(exc)) from None
    return _public(registered.model)


@router.delete("/models/{model_id}")
def delete_model(model_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """Delete a model: its queued batches are cancelled, its checkpoints deleted, its series job ended (kept, with its
    steps). 409 while a batch of it trains."""
    model = _visible(session, caller, model_id)
    series = registry.series_job(session, model)
    pending = _batches(session, series.id, (JobStatus.queued, JobStatus.running))
    if any(job.status is JobStatus.running for job in pending):
        raise HTTPException(409, "a training job of this model is running; delete it once the job has ended")
    for job in pending:
        append_event(session, job_id=job.id, kind="training_failed", data={"error_message": "the model was deleted"})
        runs.finish_job(session, job=job, status=JobStatus.cancelled, stop_reason=StopReason.cancelled,
                        error="the model was deleted")  # fmt: skip
    if series.status is JobStatus.running:
        runs.finish_job(session, job=series, status=JobStatus.cancelled, stop_reason=StopReason.cancelled,
                        error="the model was deleted through /v1/preview")  # fmt: skip
    session.delete(model)
    session.commit()
    shutil.rmtree(registry.model_dir(series, settings.data_dir), ignore_errors=True)
    return {"id": model_id, "deleted": True}


@router.get("/models/{model_id}/checkpoints", response_model=CheckpointPage)
def list_checkpoints(
    model_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 100, order: Literal["asc", "desc"] = "asc",
    after: Annotated[str | None, Query(max_length=16)] = None,
) -> CheckpointPage:  # fmt: skip
    """The model's checkpoints by step (`order`), each with what its step measured; none before the first training
    job (the base model is step 0 to sample from)."""
    model = _visible(session, caller, model_id)
    steps = registry.checkpoint_steps(session, model, settings.data_dir)
    if order == "desc":
        steps.reverse()
    if after is not None:
        if not (after.isascii() and after.isdigit()):
            raise HTTPException(422, "after: a checkpoint id (its step) is expected")
        cursor = int(after)
        steps = [s for s in steps if (s > cursor if order == "asc" else s < cursor)]
    page = steps[:limit]
    metrics = registry.step_metrics(session, model, page)
    data = [CheckpointPublic(id=str(step), step=step, metrics=metrics.get(step, {})) for step in page]
    return CheckpointPage(data=data, has_more=len(steps) > limit)


@router.delete("/models/{model_id}/checkpoints", response_model=CheckpointsDeleted)
def delete_checkpoints(
    model_id: str, body: CheckpointsDelete, session: SessionDep, caller: CallerDep, settings: SettingsDep
) -> CheckpointsDeleted:
    """Delete the checkpoints of these steps. The newest stays (the next training job starts from it): 409."""
    model = _visible(session, caller, model_id)
    steps = registry.checkpoint_steps(session, model, settings.data_dir)
    if steps and steps[-1] in body.steps:
        raise HTTPException(409, f"step {steps[-1]} is the model's newest checkpoint, which the next training starts "
                                 "from; it cannot be deleted")  # fmt: skip
    wanted = set(body.steps)
    folder = registry.model_dir(registry.series_job(session, model), settings.data_dir)
    for step in sorted(wanted & set(steps)):
        shutil.rmtree(layout.checkpoint_dir(folder, step), ignore_errors=True)
    return CheckpointsDeleted(deleted_count=len(wanted & set(steps)), not_found_steps=sorted(wanted - set(steps)))


@router.post("/training-jobs", response_model=TrainingJobCreated)
async def create_training_job(
    request: Request, caller: CallerDep, settings: SettingsDep, store: EngineDep
) -> TrainingJobCreated:
    """Queue one training step of a model on the posted trajectory groups (`{"model_id", "trajectory_groups",
    "experimental_config"}`, as ART's client posts them): the body is read to disk as it arrives and checked field by
    field (422 naming the first bad one); the job's id comes back at once and its events tell how it went."""
    incoming = await batches.receive(request.stream(), settings.data_dir)
    try:
        batch = await asyncio.to_thread(batches.read, incoming, max_trajectories=settings.client_batch_max_trajectories)
    except batches.BadBatch as exc:
        incoming.unlink(missing_ok=True)
        raise HTTPException(422, str(exc)) from None
    except BaseException:
        incoming.unlink(missing_ok=True)
        raise
    job_id = await in_request_thread(request.app.state.request_threads, _queue_batch, store, caller=caller,
                                     settings=settings, model_id=batch.model_id, incoming=incoming)  # fmt: skip
    return TrainingJobCreated(id=job_id)


@router.post("/sft-training-jobs", include_in_schema=False)
def create_sft_training_job() -> None:
    raise HTTPException(422, "supervised training through W&B artifacts (model.train_sft) is not supported by this "
                             "server; train with backend.train on trajectory groups")  # fmt: skip


@router.get("/training-jobs/{job_id}/events", response_model=EventPage)
async def training_job_events(
    job_id: str, request: Request, caller: CallerDep, store: EngineDep,
    after: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 100,
    wait: Annotated[float, Query(ge=0, le=EVENTS_HOLD_S, description="Seconds to hold the request for a job still "
                                 "training, until it ends (this server's own; 0 answers at once).")] = EVENTS_HOLD_S,
) -> EventPage | HeldPage:  # fmt: skip
    """The training job's events after the one whose id is `after`, oldest first: `training_started`, then
    `gradient_step` (the step's metrics), then `training_ended` (its checkpoint is listed by then) or
    `training_failed` (`data.error_message`). While the job trains, the page is held until it ends (at most `wait`
    seconds): ART's client asks once a second and so hears of the end as it happens, not up to a second later. A held
    page counts as one of the caller's live event streams (ARTSVC_MAX_EVENT_STREAMS_PER_TENANT), not as a request in
    progress; past that cap it comes back at once."""
    threads = request.app.state.request_threads

    async def read() -> EventPage:
        return await in_request_thread(threads, _event_page, store, caller=caller, job_id=job_id, after=after,
                                       limit=limit)  # fmt: skip

    page = await read()  # a 404 is answered here, before any hold
    slots: StreamSlots = request.app.state.stream_slots
    if _answers(page) or wait == 0 or not slots.try_take(caller):
        return page
    return HeldPage(_when_answered(page, read, wait), release=lambda: slots.give_back(caller))


class HeldPage(FreesItsSlot, StreamingResponse):
    """An events page whose headers go out at once (so it stops counting as a request in progress, as a live stream
    does) and whose body follows when its hold ends; its stream slot is freed however it ends."""

    def __init__(self, body: AsyncIterator[bytes], *, release: Callable[[], None]) -> None:
        super().__init__(body, media_type="application/json")
        self.release = release


async def _when_answered(
    page: EventPage, read: Callable[[], Awaitable[EventPage]], wait: float
) -> AsyncIterator[bytes]:
    """``page``'s JSON once it is worth answering or ``wait`` seconds have passed; a read that fails (a busy or lost
    store, or a refusal: the headers are out, so no error can be sent) ends the hold with the page read last, and the
    client asks again."""
    deadline = time.monotonic() + wait
    try:
        while not _answers(page) and time.monotonic() < deadline:
            await asyncio.sleep(EVENTS_CHECK_S)
            page = await read()
    except (SQLAlchemyError, HTTPException):
        pass
    yield page.model_dump_json().encode()


def _answers(page: EventPage) -> bool:
    """Whether ``page`` is worth answering now: it ends the job's log, or the client has more to read."""
    return page.has_more or any(event.type in ENDING_KINDS for event in page.data)


def _event_page(store: Any, *, caller: Principal, job_id: str, after: str | None, limit: int) -> EventPage:
    with Session(store) as session:
        job = runs.get_job(session, job_id=job_id) if runs.is_job_id(job_id) else None
        if job is None or job.kind != JobKind.client_batch or not (caller.is_operator or job.owner_id == caller.id):
            raise HTTPException(404, f"training job {job_id!r} not found")
        mine = col(JobEvent.job_id) == job.id, col(JobEvent.kind).in_(EVENT_KINDS), col(JobEvent.id) > int(after or 0)
        rows = session.exec(select(JobEvent).where(*mine).order_by(col(JobEvent.id)).limit(limit + 1)).all()
    data = [EventPublic(id=str(row.id), type=row.kind, data=row.data) for row in rows[:limit]]
    return EventPage(data=data, has_more=len(rows) > limit)


def _queue_batch(store: Any, *, caller: Principal, settings: Settings, model_id: str, incoming: Path) -> str:
    """The batch as a queued client_batch job of its model (its file renamed to the job's), committed."""
    with Session(store, expire_on_commit=False) as session:
        try:
            model = _visible(session, caller, model_id)
            series = registry.series_job(session, model)
            if series.status is not JobStatus.running:
                reason = series.stop_reason.value if series.stop_reason else series.status.value
                raise HTTPException(409, f"model {model.entity}/{model.project}/{model.name} has stopped training "
                                         f"({reason}): it takes no more training jobs")  # fmt: skip
            tenancy.hold_queue(session, caller=caller)
            if (refusal := tenancy.refuse_queue(session, caller=caller, settings=settings)) is not None:
                raise HTTPException(429, refusal, headers=tenancy.RETRY_LATER)
        except BaseException:
            session.rollback()
            incoming.unlink(missing_ok=True)
            raise
        job = Job(id=str(uuid.uuid4()), kind=JobKind.client_batch, status=JobStatus.queued,
                  environment=series.environment, spec=series.spec, parent_id=series.id, owner_id=caller.id,
                  created_at=utcnow())  # fmt: skip
        kept = batches.keep(incoming, settings.data_dir, job.id)
        try:
            runs.insert_queued(session, job)
            session.commit()
        except BaseException:
            kept.unlink(missing_ok=True)
            raise
        return job.id


def _visible(session: Session, caller: Principal, model_id: str) -> ClientModel:
    if (model := registry.visible(session, caller=caller, model_id=model_id)) is None:
        raise HTTPException(404, f"model {model_id!r} not found")
    return model


def _batches(session: Session, series_id: str, statuses: tuple[JobStatus, ...]) -> list[Job]:
    query = select(Job).where(col(Job.parent_id) == series_id, col(Job.kind) == JobKind.client_batch,
                              col(Job.status).in_(statuses))  # fmt: skip
    return list(session.exec(query).all())


def _public(model: ClientModel) -> ModelPublic:
    return ModelPublic(id=model.id, entity=model.entity, project=model.project, name=model.name,
                       base_model=model.base_model, run_id=model.job_id)  # fmt: skip
