"""Chat completions on trained checkpoints, for the API (``POST /v1/chat/completions``).

One worker thread does every piece of model work: loading a checkpoint, rendering the prompt, sampling and building
the response. A request thread never runs a model and two requests never use one at once. The last ``cache_size``
checkpoints used stay loaded, keyed by directory and its modification time and inode, so a checkpoint rewritten
in place loads again. One request is answered at a time and at most ``max_waiting`` wait behind it; the next gets
503 with ``Retry-After`` at once instead of a growing queue.

torch, transformers and peft are imported on the worker thread when a model is first loaded: importing this module
(the API does) loads none of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from service.backends.openai_server import ChatCompletionRequest, ServingError

logger = logging.getLogger(__name__)

CACHE_SIZE = 2  # checkpoints kept loaded (a SmolLM2-135M base and adapter: about 0.55 GB each in float32)
MAX_WAITING = 4  # requests waiting behind the one being answered; beyond, 503
RETRY_AFTER_S = 5


class InferenceEngine:
    """Answers chat completions from checkpoint directories on its own thread; ``close`` when the app stops."""

    def __init__(self, *, cache_size: int = CACHE_SIZE, max_waiting: int = MAX_WAITING) -> None:
        self.cache_size, self.max_waiting = cache_size, max_waiting
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self._loaded: OrderedDict[tuple[str, int, int], Any] = OrderedDict()  # the worker thread's alone
        self._in_flight = 0  # being answered or waiting; the event loop's alone

    async def complete(
        self, folder: Path, request: ChatCompletionRequest, *, model: str, default_max_tokens: int
    ) -> dict[str, Any]:
        """The response body for ``request`` from the checkpoint in ``folder``, answered as ``model``.

        ServingError: 503 when ``max_waiting`` requests already wait, 409 when the checkpoint cannot be loaded,
        400 when its template cannot render the messages or the prompt passes the model's context."""
        if self._in_flight > self.max_waiting:
            raise ServingError(
                503, f"the inference queue is full ({self.max_waiting} requests waiting); retry shortly", "overloaded",
                {"Retry-After": str(RETRY_AFTER_S)},
            )  # fmt: skip
        self._in_flight += 1
        try:
            work = self._executor.submit(self._complete, folder, request, model, default_max_tokens)
            return await asyncio.wrap_future(work)
        finally:
            self._in_flight -= 1

    def close(self) -> None:
        """Stop taking work; what waits is cancelled, the request being answered finishes on its own."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _complete(self, folder: Path, request: ChatCompletionRequest, model: str, default_max_tokens: int) -> Any:
        return self._model(folder, model).complete(request, model=model, default_max_tokens=default_max_tokens)

    def _model(self, folder: Path, name: str) -> Any:
        from service.backends.transformers.inference import CheckpointModel, NotServable

        try:
            info = folder.stat()
        except OSError:
            message = f"model {name!r}: its checkpoint is gone (pruned by training)"
            raise ServingError(404, message, "model_not_found") from None
        key = (str(folder), info.st_mtime_ns, info.st_ino)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        try:
            loaded = CheckpointModel(folder)
        except NotServable as exc:
            raise ServingError(409, f"model {name!r} cannot be served: {exc}", "model_not_servable") from None
        except Exception:  # a corrupt checkpoint: the log has the traceback, the client a reason without paths
            logger.exception("loading the checkpoint %s failed", folder)
            message = f"model {name!r}: its checkpoint could not be loaded"
            raise ServingError(409, message, "model_not_servable") from None
        self._loaded[key] = loaded
        while len(self._loaded) > self.cache_size:
            self._loaded.popitem(last=False)
        return loaded
