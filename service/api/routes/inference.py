"""``POST /v1/chat/completions``: OpenAI chat completions from a trained checkpoint of one of the caller's jobs, so
the official ``openai`` client talks to what was trained (service/inference runs the model in a process of its own).

``model`` is ``JOB_ID`` (the job's best validation step if it has one, else its latest checkpoint) or ``JOB_ID@STEP``
(a number, ``best`` or ``latest``); the response's ``model`` names the job and the step served. A model ART's client
registered (/v1/preview) is named as ART names it, ``wandb-artifact:///{entity}/{project}/{name}[:step{N}]``, and
answers with logprobs whether asked or not (service/art_client/serving.py). Every refusal is in
OpenAI's error envelope, so OpenAI clients raise their usual exceptions: another tenant's job, an unknown one or a
step without a checkpoint 404 (another tenant's exactly as an unknown one), an embedded-backend job or a checkpoint
that is no PEFT adapter 409, an invalid or unbounded request 400 (naming the limit and its setting), a caller with
too many requests waiting for the model 429 with ``Retry-After``, an inference process that died while answering 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from starlette.exceptions import HTTPException

from service import checkpoints
from service.art_client import names
from service.art_client import serving as client_serving
from service.api.deps import CallerDep, EngineDep, SessionDep, SettingsDep, visible_job
from service.api.errors import ErrorBody
from service.api.routes.jobs import MAX_STEP
from service.api.schemas import ChatCompletionCreate, OpenAIErrorBody
from service.api.threads import in_request_thread
from service.auth import Principal
from service.backends.openai_server import ServingError, answered, error_response, stream_asked, validation_message
from service.inference import InferenceEngine
from service.settings import Settings
from service.store import runs
from service.store.tables import ClientModel, Job, JobKind

CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "permission_denied", 404: "model_not_found",
         409: "model_not_servable", 415: "invalid_request", 422: "invalid_request"}  # fmt: skip
RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": OpenAIErrorBody, "description": "Refused, in OpenAI's error envelope: 400 an invalid request, 401 "
            "no or a wrong token, 404 no such job of yours or no checkpoint at that step, 409 a checkpoint that is no "
            "PEFT adapter (an embedded-backend job)."},
    413: {"model": ErrorBody, "description": "The body is larger than ARTSVC_MAX_BODY_BYTES."},
    429: {"model": ErrorBody | OpenAIErrorBody, "description": "Too many requests of this credential in progress "
          "(`detail`), or waiting for the model (OpenAI's envelope, ARTSVC_INFERENCE_MAX_WAITING_PER_TENANT); retry "
          "after `Retry-After` seconds."},
    503: {"model": OpenAIErrorBody, "description": "The inference process stopped while answering; retry after "
          "`Retry-After` seconds."},
}  # fmt: skip


class OpenAIRoute(APIRoute):
    """A route whose refusals (its dependencies' too: authentication, validation) use OpenAI's error envelope: an
    invalid request is a ``validation_status``, an HTTPException's code is looked up in ``codes``."""

    validation_status = 400
    codes = CODES

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except ServingError as exc:
                return error_response(exc.status, exc.message, exc.code, exc.headers)
            except RequestValidationError as exc:
                return error_response(self.validation_status, validation_message(exc), "invalid_request")
            except HTTPException as exc:
                code = self.codes.get(exc.status_code, "error")
                return error_response(exc.status_code, str(exc.detail), code, exc.headers)

        return answer


T = TypeVar("T")

router = APIRouter(prefix="/v1", tags=["inference"], route_class=OpenAIRoute)


@router.post("/chat/completions", responses=RESPONSES)
async def chat_completions(
    body: ChatCompletionCreate, request: Request, caller: CallerDep, settings: SettingsDep, store: EngineDep
) -> dict[str, Any]:
    """An OpenAI `chat.completion` from a checkpoint of one of your jobs (transformers backend): `n`, `temperature`,
    `top_p`, `max_tokens`, `stop`, `seed`, `logprobs` (tokens named `token_id:N`), `top_logprobs`, `tools`
    (Hermes tool calls returned as `tool_calls`), `tool_choice` (`auto`, `required` or a named function: the reply is
    held to calls of the tools, their arguments to the tools' schemas; with `parallel_tool_calls: false`, to one
    call) and `response_format` (`json_schema` or `json_object`: the reply is held to the schema as it is sampled).
    A base model the operator serves (ARTSVC_SERVED_BASE_MODELS) is named by its name. Without `max_tokens`, up to
    ARTSVC_INFERENCE_MAX_TOKENS. `stream`: the completion as server-sent `chat.completion.chunk` events ending in
    `[DONE]`, once it is sampled."""
    limit = settings.inference_max_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        if (value := getattr(body, name)) is not None and value > limit:
            raise ServingError(400, f"invalid request: {name}: at most {limit} (ARTSVC_INFERENCE_MAX_TOKENS)",
                               "invalid_request")  # fmt: skip
    stream = stream_asked(body)
    return answered(await _complete(body, request, caller=caller, settings=settings, store=store), stream=stream)


async def _complete(
    body: ChatCompletionCreate, request: Request, *, caller: Principal, settings: Settings, store: Engine
) -> dict[str, Any]:
    inference: InferenceEngine = request.app.state.inference
    threads = request.app.state.request_threads
    if names.is_artifact_name(body.model):  # a model of ART's client: logprobs always, as ART's own server does
        served = await in_request_thread(threads, client_serving.find, store, caller=caller, data_dir=settings.data_dir,
                                         model=body.model)  # fmt: skip
        body = body.model_copy(update={"logprobs": True}) if not body.logprobs else body
        return await unless_disconnected(request, inference.complete(
            served.folder, body, model=served.name, tenant=caller.id, base_model=served.base_model))
    if (source := settings.served_base_model(body.model)) is not None:  # the operator's: a local judge, say
        served = inference.complete(None, body, model=body.model, tenant=caller.id, base_model=source)
        return await unless_disconnected(request, served)
    job_id, checkpoint = await in_request_thread(threads, find_checkpoint, store, caller=caller, settings=settings,
                                                 model=body.model)  # fmt: skip
    served_name = f"{job_id}@{checkpoint.step}"
    work = inference.complete(checkpoint.path, body, model=served_name, tenant=caller.id)
    return await unless_disconnected(request, work)


MAX_LISTED_JOBS = 100  # the newest jobs /v1/models lists


@router.get("/models", responses=RESPONSES)
def list_models(session: SessionDep, caller: CallerDep, settings: SettingsDep) -> dict[str, Any]:
    """The models you can sample from here, as OpenAI lists them: the base models the operator serves, the models your
    ART client registered (named as ART names them: their newest checkpoint) and your newest training jobs of the
    transformers backend (by id: the best step, else the latest)."""
    models = session.exec(select(ClientModel).where(col(ClientModel.owner_id) == caller.id)
                          .order_by(col(ClientModel.created_at).desc())).all()  # fmt: skip
    series = {model.job_id for model in models}
    jobs = session.exec(select(Job).where(col(Job.owner_id) == caller.id, col(Job.kind) == JobKind.training)
                        .order_by(col(Job.created_at).desc()).limit(MAX_LISTED_JOBS + len(series))).all()  # fmt: skip
    data = [_listed(entry.partition("=")[0], 0) for entry in settings.served_base_models]
    data += [_listed(names.artifact_name(m.entity, m.project, m.name), m.created_at.timestamp()) for m in models]
    data += [_listed(job.id, job.created_at.timestamp()) for job in jobs
             if job.id not in series and checkpoints.job_backend(job) == "transformers"][:MAX_LISTED_JOBS]  # fmt: skip
    return {"object": "list", "data": data}


def _listed(model_id: str, created: float) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": int(created), "owned_by": "artsvc"}


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result, or, if the client goes away first, ``work`` cancelled (it leaves the queue, or the model
    stops before its next token) and a 499 that nobody reads."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        task.cancel()  # nothing if it is done
    await asyncio.wait((task,))
    if task.cancelled():
        raise ServingError(499, "the client closed the request", "client_closed_request")
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the body was read: what ``receive`` gives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def find_checkpoint(
    store: Engine, *, caller: Principal, settings: Settings, model: str
) -> tuple[str, checkpoints.Checkpoint]:
    """The job id and the checkpoint ``model`` names, if the caller may see the job; ServingError (404, 409) if not.

    The database session is its own and closed before the model runs: a request waiting for the model holds no
    connection."""
    job_id, at, step_text = model.partition("@")
    step: int | str | None = None
    if at:
        number = step_text.isascii() and step_text.isdigit()  # str.isdigit alone admits "²", which int() refuses
        if step_text not in ("best", "latest") and not (number and len(step_text) <= 10):
            message = f"model {model!r} does not exist: a step is a number, best or latest"
            raise ServingError(404, message, "model_not_found")
        step = int(step_text) if number else step_text
    with Session(store) as session:
        job = visible_job(session, caller=caller, job_id=job_id)
        points = runs.validation_points(session, job_id=job.id) if step in (None, "best") else []
    if (backend := checkpoints.job_backend(job)) == "embedded":
        raise ServingError(
            409, f"job {job.id} trained on the embedded backend: its checkpoints are artsvc's own character model, "
            "not PEFT adapters; only transformers-backend jobs are served here", "model_not_servable",
        )  # fmt: skip
    best = checkpoints.best_step(job, points)
    wanted = step if step is not None else ("best" if best is not None else "latest")
    if isinstance(wanted, int) and wanted > MAX_STEP:
        raise ServingError(404, f"model {model!r}: job {job.id} has no checkpoint at step {wanted}", "model_not_found")
    found = checkpoints.find(checkpoints.model_dir(job, settings.data_dir))
    try:
        checkpoint = checkpoints.pick(found, wanted, best=best)
    except checkpoints.NoCheckpoint as exc:
        raise ServingError(404, f"model {model!r}: job {job.id} {exc}", "model_not_found") from None
    if not checkpoint.exportable:
        message = f"model {model!r}: job {job.id} ({backend} backend): step {checkpoint.step} is not a PEFT adapter"
        raise ServingError(409, message, "model_not_servable")
    return job.id, checkpoint
