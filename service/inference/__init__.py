"""Chat completions on trained checkpoints, for the API (``POST /v1/chat/completions``).

No model work happens in the API process: a child process does all of it (service/inference/child.py), at the
workers' CPU policy (SCHED_IDLE by default) on ``inference_threads`` torch threads, so a long prompt can neither stall
the event loop nor take the CPU from training, and its memory is not the API's. It is started on first use and again
after it died, and it dies with the API.

What one request may cost is bounded before the model is touched (bounds.py): n × max_tokens here, prompt tokens × n
in the child before any forward pass, and sampling stops at the deadline (seconds of the request's own model work).
A caller's requests on one checkpoint that arrive together (an ART step's rollouts) are one batch, decoded together
as the training backend decodes a step (up to MAX_BATCH_ROWS completions). The child works on up to
``inference_max_active_callers`` batches at once, one per caller, switching the model between them every quarter of a
second (baton.py); the callers take turns at those places round-robin, each with a line of at most
``inference_max_waiting_per_tenant`` batches waiting (turns.py): one tenant's flood slows another tenant's chat by a
share of the model, not by the flooder's requests, and the flooder alone gets 429. A request whose client went away
leaves its batch; a batch none of whose requests is waiting leaves its line, or, being answered, is cancelled in the
child before its next token, and its turn passes on.

Importing this package loads no torch: the child does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.backends.batching import gathered
from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.backends.transformers.models import base_model_cache
from service.inference.bounds import Bounds
from service.inference.process import InferenceProcess
from service.inference.turns import FairTurns, TurnsFull
from service.settings import Settings

__all__ = ["InferenceEngine"]

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
MAX_BATCH_ROWS = 64  # completions (n summed) of one caller's requests on one checkpoint decoded together
CANCELLED = {"status": 499, "message": "the client closed the request", "code": "client_closed_request"}
STUCK_S = 300  # past the deadline, a request still unanswered (a hung child; loading a checkpoint counts) is abandoned


@dataclass
class _Member:
    """One request of a batch, and where its answer goes (``{"body"}`` or ``{"error"}``)."""

    request: ChatCompletionRequest
    model: str
    answer: asyncio.Future[dict[str, Any]]


@dataclass
class _Batch:
    """One caller's requests on one checkpoint, sent to the child as one message."""

    members: list[_Member]
    rows: int
    message_id: int | None = None
    task: asyncio.Future[None] | None = field(default=None, repr=False)  # kept: the loop holds tasks weakly

    def settle(self, answer: dict[str, Any]) -> None:
        for member in self.members:
            _settle(member.answer, answer)

    def fail(self, exc: BaseException) -> None:
        for member in self.members:
            if not member.answer.done():
                member.answer.set_exception(exc)


def _settle(future: asyncio.Future[dict[str, Any]], answer: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(answer)


class InferenceEngine:
    """Answers chat completions through the inference process, fairly between tenants; ``close`` when the app stops.

    ``process`` shares a running child (tests); by default the engine starts its own and ``close`` stops it."""

    def __init__(self, settings: Settings, *, process: InferenceProcess | None = None) -> None:
        self.bounds = Bounds.of(settings)
        self.default_max_tokens = settings.inference_max_tokens
        self.cache_dir = str(base_model_cache(settings.data_dir))  # base models converted there, as training
        self.turns = FairTurns(
            max_waiting=settings.inference_max_waiting_per_tenant, capacity=settings.inference_max_active_callers
        )
        self.process = process or InferenceProcess.of(settings)
        self._owns_process = process is None
        self._forming: dict[tuple[str, str | None, str | None], _Batch] = {}  # per caller and checkpoint

    async def complete(
        self, folder: Path | None, request: ChatCompletionRequest, *, model: str, tenant: str,
        base_model: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The response body for ``request`` from the checkpoint in ``folder`` (None: the base model ``base_model``
        alone), answered as ``model``, in ``tenant``'s turn. The caller's requests on one checkpoint that arrive
        together (an ART step's rollouts) are decoded together, up to MAX_BATCH_ROWS completions. Cancelling it (the
        client went away) drops it; the work stops once no request of its batch is waiting for it.

        ServingError: 400 past the bounds or for messages the template cannot render, 429 when ``tenant`` already
        has ``max_waiting`` batches waiting, 404 or 409 when the checkpoint is gone or cannot be served, 503 when the
        inference process died while answering."""
        max_tokens = request.max_completion_tokens or request.max_tokens or self.default_max_tokens
        self.bounds.check_completion(n=request.n, max_tokens=max_tokens)
        key = (tenant, None if folder is None else str(folder), base_model)
        member = _Member(request, model, asyncio.get_running_loop().create_future())
        batch = self._forming.get(key)
        if batch is not None and batch.rows + request.n <= MAX_BATCH_ROWS:
            batch.members.append(member)
            batch.rows += request.n
        else:
            batch = self._forming[key] = _Batch([member], request.n)
            batch.task = asyncio.ensure_future(self._answer(key, batch))
        try:
            answer = await asyncio.shield(member.answer)
        except asyncio.CancelledError:
            member.answer.cancel()
            if all(m.answer.done() for m in batch.members):  # nobody waits for the batch any more
                if batch.message_id is not None:
                    self.process.cancel(batch.message_id)  # being answered: the child stops before its next token
                elif batch.task is not None:
                    batch.task.cancel()  # waiting for its turn: it leaves the line
            raise
        if "error" in answer:
            error = answer["error"]
            headers = {"Retry-After": str(RETRY_AFTER_S)} if error["status"] in (429, 503) else None
            raise ServingError(error["status"], error["message"], error["code"], headers)
        return answer["body"]

    async def _answer(self, key: tuple[str, str | None, str | None], batch: _Batch) -> None:
        """Take the tenant's turn for ``batch`` (joined by the caller's requests until then), send it to the child and
        give each member its answer."""
        tenant, folder, base_model = key
        try:
            await gathered(lambda: len(batch.members))
            await self.turns.acquire(tenant)
        except TurnsFull:
            batch.settle({"error": {"status": 429, "code": "rate_limit_exceeded", "message": f"you have "
                          f"{self.turns.max_waiting} batches of chat completions waiting for the model "
                          "(ARTSVC_INFERENCE_MAX_WAITING_PER_TENANT); retry shortly"}})  # fmt: skip
            return
        finally:
            if self._forming.get(key) is batch:
                del self._forming[key]  # sealed: the caller's next requests form the next batch
        members = [m for m in batch.members if not m.answer.done()]
        if not members:
            self.turns.release(tenant)
            return
        try:
            batch.message_id, reply = self.process.submit({
                "folder": folder, "base_model": base_model, "cache_dir": self.cache_dir,
                "members": [{"model": m.model, "request": m.request.model_dump(mode="json")} for m in members],
                "default_max_tokens": self.default_max_tokens, "bounds": self.bounds.as_dict(),
            })  # fmt: skip
        except BaseException as exc:
            self.turns.release(tenant)
            batch.fail(exc)
            return
        reply.add_done_callback(lambda _: self.turns.release(tenant))  # the turn passes on when the child is done
        stuck_s = self.bounds.deadline_s * self.turns.capacity + STUCK_S  # it shares the model with the others
        try:
            answer = await asyncio.wait_for(asyncio.shield(reply), stuck_s)
        except TimeoutError:
            logger.error("the inference process answered nothing in %s s: killing it", stuck_s)
            await asyncio.to_thread(self.process.close)  # what it was sent gets 503; the next request starts another
            answer = await reply
        if "answers" in answer:
            for member, given in zip(members, answer["answers"]):
                _settle(member.answer, given)
        else:  # an error for every member, or cancelled (nobody waits)
            batch.settle({"error": answer.get("error") or CANCELLED})

    def close(self) -> None:
        """Stop the inference process if it is this engine's own."""
        if self._owns_process:
            self.process.close()
