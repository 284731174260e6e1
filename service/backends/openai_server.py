"""An OpenAI-compatible ``/v1/chat/completions`` endpoint in front of a backend's policies.

Supports ``n``, ``temperature``, ``top_p``, ``max_tokens`` (or ``max_completion_tokens``), ``stop``, ``seed``,
``logprobs``, ``top_logprobs``, ``stream`` (the answer as OpenAI's server-sent chunks, once sampled) and tool calls
(written by the policy as text in its format's convention, returned as OpenAI ``tool_calls``). Models are addressed
as ``name`` (latest step) or ``name@step``. Errors use OpenAI's error envelope so OpenAI clients raise their usual
exceptions. What differs between policies (how messages become
prompt tokens, how a token is named in ``logprobs``, how tool calls are written) is the :class:`ChatFormat`.

Each choice also carries ``context_tokens``: how many prompt tokens the policy was conditioned on
after left truncation. The trainer rebuilds exactly that context, so the logprobs it optimises
are the ones the server sampled with.

The policy server (:func:`build_app`) and the service's own ``POST /v1/chat/completions`` on trained checkpoints
(service/api/routes/inference.py) share the request model, :func:`sampling_request` and :func:`completion`, which
builds the response body, and :func:`error_response` for OpenAI's error envelope.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from service.backends import openai_stream

DEFAULT_MAX_TOKENS = 16


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # other OpenAI parameters are accepted and ignored

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None  # enables parsing tool calls out of the policy's text
    response_format: dict[str, Any] | None = None  # json_schema or json_object: the reply is held to it
    tool_choice: str | dict[str, Any] | None = None  # required or a named function: the reply is calls, held to them
    parallel_tool_calls: bool | None = None  # false: a held reply is one call (OpenAI's default is true)


class ServingError(Exception):
    """An error answered to the client with an HTTP status and OpenAI's error envelope."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers


@dataclass
class Sample:
    """One sampled completion, as every backend's sampler returns it."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the policy's own (temperature 1) logprob of each token
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" on end of turn or a stop string
    stop_reason: str | None = None  # the stop string that ended the text, None for end of turn
    context_tokens: int = 0  # prompt tokens the sample was conditioned on (after any left truncation)


class Reply(Protocol):
    content: str | None
    tool_calls: list[dict[str, Any]]


class ChatFormat(Protocol):
    """How one kind of policy reads requests and writes replies."""

    def sampling_request(self, request: ChatCompletionRequest, *, max_tokens: int, stop: tuple[str, ...]) -> Any:
        """The backend's sampling request: the rendered prompt and the sampling parameters."""

    def token_text(self, model: str, token_id: int) -> tuple[str, bytes]:
        """The ``token`` a logprobs entry of ``model`` names (one that maps back to ``token_id``), and its bytes."""

    def parse_tool_calls(self, text: str, *, call_id_prefix: str) -> Reply:
        """The reply's content and the tool calls written in it."""


Generate = Callable[[str, Any], Awaitable[tuple[str, list[Sample]]]]


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error envelope, ``{"error": {"message", "type", "code"}}``: OpenAI clients raise the exception of
    the status (404: NotFoundError) with ``message``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "code": code}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def validation_message(exc: RequestValidationError, *, at_most: int = 3) -> str:
    """The invalid fields and what is wrong with each (a union's every branch), as one line."""
    found = [
        f"{'.'.join(str(p) for p in error.get('loc', ()) if p != 'body')}: {error.get('msg', 'invalid')}"
        for error in exc.errors()[:at_most]
    ]
    return "invalid request: " + ("; ".join(found) or "invalid")


def _logprob_entry(
    fmt: ChatFormat, model: str, token_id: int, logprob: float, top: list[tuple[int, float]] | None
) -> dict[str, Any]:
    def named(token: int, value: float) -> dict[str, Any]:
        text, raw = fmt.token_text(model, token)
        return {"token": text, "logprob": value, "bytes": list(raw)}

    return {**named(token_id, logprob), "top_logprobs": [named(t, lp) for t, lp in (top or [])]}


def _choice(fmt: ChatFormat, index: int, s: Sample, request: ChatCompletionRequest, completion_id: str) -> dict[str, Any]:
    logprobs = None
    if request.logprobs:
        tops = s.top_logprobs if request.top_logprobs else [None] * len(s.token_ids)
        logprobs = {"content": [_logprob_entry(fmt, request.model, t, lp, top) for t, lp, top in zip(s.token_ids, s.logprobs, tops)]}
    message: dict[str, Any] = {"role": "assistant", "content": s.text}
    finish_reason = s.finish_reason
    if request.tools:
        reply = fmt.parse_tool_calls(s.text, call_id_prefix=f"call_{completion_id}_{index}")
        if reply.tool_calls:
            message = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            finish_reason = "tool_calls" if s.finish_reason == "stop" else s.finish_reason
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "stop_reason": s.stop_reason,  # as vLLM reports it: the stop string, or None for end of turn
        "context_tokens": s.context_tokens,
        "logprobs": logprobs,
    }


def sampling_request(
    request: ChatCompletionRequest, fmt: ChatFormat, *, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> Any:
    """The backend's sampling request for ``request`` (its stop strings as a tuple, its token limit or the default);
    ServingError where the format cannot render the messages."""
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    return fmt.sampling_request(request, max_tokens=max_tokens, stop=stop)


def completion(
    request: ChatCompletionRequest, fmt: ChatFormat, *, model: str, samples: list[Sample], prompt_tokens: int
) -> dict[str, Any]:
    """The ``chat.completion`` body: one choice per sample (tool calls parsed when the request has tools, logprobs
    when asked), ``model`` as resolved, and the usage counts."""
    completion_tokens = sum(len(s.token_ids) + (s.finish_reason == "stop") for s in samples)
    completion_id = secrets.token_hex(12)
    return {
        "id": f"chatcmpl-{completion_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(fmt, i, s, request, completion_id) for i, s in enumerate(samples)],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_asked(request: BaseModel) -> bool:
    """Whether ``request`` asks for OpenAI's server-sent stream (``stream: true``); a 400 for a value not a boolean."""
    stream = (request.model_extra or {}).get("stream")
    if stream is not None and not isinstance(stream, bool):  # not ``in (True, False)``: 1 == True would pass
        raise ServingError(400, "invalid request: stream: a boolean is expected", "invalid_request")
    return bool(stream)


def answered(completion: dict[str, Any], *, stream: bool) -> Any:
    """``completion`` as the body of a response, or as the stream of ``chat.completion.chunk`` events asked for."""
    if not stream:
        return completion
    return StreamingResponse(openai_stream.chunks(completion), media_type="text/event-stream")


async def chat_completion(request: ChatCompletionRequest, generate: Generate, fmt: ChatFormat) -> dict[str, Any]:
    """The response to ``request``: rendered by ``fmt``, sampled by ``generate``, built by :func:`completion`."""
    sampling = sampling_request(request, fmt)
    model, samples = await generate(request.model, sampling)
    return completion(request, fmt, model=model, samples=samples, prompt_tokens=len(sampling.prompt_ids))


def build_app(generate: Generate, api_key: str, fmt: ChatFormat) -> FastAPI:
    """The ASGI app; ``generate(model, sampling_request)`` returns the resolved model name and samples."""
    app = FastAPI(title="artsvc policy server", docs_url=None, redoc_url=None)

    @app.exception_handler(ServingError)
    async def _serving_error(_: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(exc), "invalid_request")

    # async: FastAPI runs a plain ``def`` dependency on a worker thread, a hop through the thread pool (and up to 40
    # threads) for every request of a rollout batch, for a string comparison
    async def check_key(authorization: Annotated[str | None, Header()] = None) -> None:
        # as bytes: a header holding a non-ASCII character made compare_digest raise on str, a 500 for a wrong key
        if not authorization or not secrets.compare_digest(authorization.encode(), f"Bearer {api_key}".encode()):
            raise ServingError(401, "missing or wrong API key", "invalid_api_key")

    # a streamed answer is sent once sampled: a rollout that streams (an ART user's own) reads the same reply
    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(request: ChatCompletionRequest) -> Any:
        stream = stream_asked(request)
        return answered(await chat_completion(request, generate, fmt), stream=stream)

    return app
