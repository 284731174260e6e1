"""Chat completions on trained checkpoints, for the API (``POST /v1/chat/completions``).

No model work happens in the API process: a child process does all of it (service/inference/child.py), at the
workers' CPU policy (SCHED_IDLE by default) on ``inference_threads`` torch threads, so a long prompt can neither stall
the event loop nor take the CPU from training, and its memory is not the API's. It is started on first use and again
after it died, and it dies with the API.

What one request may cost is bounded before the model is touched (bounds.py): n × max_tokens here, prompt tokens × n
in the child before any forward pass, and sampling stops at the deadline (seconds of the request's own model work).
The child works on up to ``inference_max_active_callers`` requests at once, one per caller, switching the model
between them every quarter of a second (baton.py); the callers take turns at those places round-robin, each with a
line of at most ``inference_max_waiting_per_tenant`` waiting (turns.py): one tenant's flood slows another tenant's
chat by a share of the model, not by the flooder's requests, and the flooder alone gets 429. A request whose client went away leaves its line, or, being answered, is cancelled in the child
before its next token, and its turn passes on.

Importing this package loads no torch: the child does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.inference.bounds import Bounds
from service.inference.process import InferenceProcess
from service.inference.turns import FairTurns, TurnsFull
from service.settings import Settings

__all__ = ["InferenceEngine"]

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
STUCK_S = 300  # past the deadline, a request still unanswered (a hung child; loading a checkpoint counts) is abandoned


class InferenceEngine:
    """Answers chat completions through the inference process, fairly between tenants; ``close`` when the app stops.

    ``process`` shares a running child (tests); by default the engine starts its own and ``close`` stops it."""

    def __init__(self, settings: Settings, *, process: InferenceProcess | None = None) -> None:
        self.bounds = Bounds.of(settings)
        self.default_max_tokens = settings.inference_max_tokens
        self.cache_dir = str(settings.data_dir / "cache" / "base-models")  # where base models are converted (as training)
        self.turns = FairTurns(
            max_waiting=settings.inference_max_waiting_per_tenant, capacity=settings.inference_max_active_callers
        )
        self.process = process or InferenceProcess.of(settings)
        self._owns_process = process is None

    async def complete(
        self, folder: Path | None, request: ChatCompletionRequest, *, model: str, tenant: str, base_model: str | None = None
    ) -> dict[str, Any]:
        """The response body for ``request`` from the checkpoint in ``folder`` (None: the base model ``base_model``
        alone), answered as ``model``, in ``tenant``'s turn. Cancelling it (the client went away) stops the work.

        ServingError: 400 past the bounds or for messages the template cannot render, 429 when ``tenant`` already
        has ``max_waiting`` requests waiting, 404 or 409 when the checkpoint is gone or cannot be served, 503 when the
        inference process died while answering."""
        max_tokens = request.max_completion_tokens or request.max_tokens or self.default_max_tokens
        self.bounds.check_completion(n=request.n, max_tokens=max_tokens)
        try:
            await self.turns.acquire(tenant)
        except TurnsFull:
            raise ServingError(
                429, f"you have {self.turns.max_waiting} chat completions waiting for the model "
                "(ARTSVC_INFERENCE_MAX_WAITING_PER_TENANT); retry shortly", "rate_limit_exceeded",
                {"Retry-After": str(RETRY_AFTER_S)},
            ) from None  # fmt: skip
        try:
            message_id, reply = self.process.submit({
                "folder": None if folder is None else str(folder), "base_model": base_model, "cache_dir": self.cache_dir,
                "model": model, "request": request.model_dump(mode="json"), "default_max_tokens": self.default_max_tokens,
                "bounds": self.bounds.as_dict(),
            })  # fmt: skip
        except BaseException:
            self.turns.release(tenant)
            raise
        reply.add_done_callback(lambda _: self.turns.release(tenant))  # the turn passes on when the child is done
        stuck_s = self.bounds.deadline_s * self.turns.capacity + STUCK_S  # it shares the model with the others
        try:
            answer = await asyncio.wait_for(asyncio.shield(reply), stuck_s)
        except asyncio.CancelledError:
            self.process.cancel(message_id)
            raise
        except TimeoutError:
            logger.error("the inference process answered nothing in %s s: killing it", stuck_s)
            await asyncio.to_thread(self.process.close)  # what it was sent gets 503; the next request starts another
            answer = await reply
        if "error" in answer:
            error = answer["error"]
            headers = {"Retry-After": str(RETRY_AFTER_S)} if error["status"] == 503 else None
            raise ServingError(error["status"], error["message"], error["code"], headers)
        return answer["body"]

    def close(self) -> None:
        """Stop the inference process if it is this engine's own."""
        if self._owns_process:
            self.process.close()
