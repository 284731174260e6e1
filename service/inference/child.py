"""The inference process: ``python -m service.inference.child --parent PID ...``, started by the API
(service/inference/process.py). It works on each message it is sent (one caller's batch of chat completions) on a
thread of its own, the model one message at a time in slices (service/inference/baton.py); the API sends at most one
batch per caller and a few at once (service/inference/turns.py).

It settles as the workers do (their CPU policy, SIGTERM when the API dies: service/worker/supervisor.py), runs torch
on the threads its environment allows (``OMP_NUM_THREADS``), and reads JSON lines on stdin:
``{"op": "complete", "id", "folder", "members": [{"model", "request"}], "default_max_tokens", "bounds"}`` (one
caller's requests on one checkpoint, decoded together; ``folder`` None: the base model ``base_model``, converted into
``cache_dir`` as training does) and ``{"op": "cancel", "id"}``. It writes one JSON line per message to its stdout:
``{"id", "answers": [{"body"} or {"error"}, ...]}`` (one per member), ``{"id", "error": {"status", "message",
"code"}}`` (every member's) or ``{"id", "cancelled": true}``. A cancel, the deadline in ``bounds`` (seconds of the
message's own work) and a hand-over of the model are seen before each chunk of the prompt encoded and each token
decoded. The last ``CACHE_SIZE`` checkpoints used stay loaded, keyed by directory, modification time and inode, so a
checkpoint rewritten in place loads again. Closing stdin ends it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import queue
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.inference.baton import Baton, Work
from service.inference.bounds import Bounds
from service.worker.supervisor import settle_as_child

logger = logging.getLogger(__name__)

MODEL_MODULE = "service.backends.transformers.inference"  # imports torch: on a thread of its own at the start
CACHE_SIZE = 2  # checkpoints kept loaded (a SmolLM2-135M base and adapter: about 0.55 GB each in float32)


class Checkpoints:
    """The last ``size`` checkpoints used, loaded, their base models in ``precision``."""

    def __init__(self, size: int = CACHE_SIZE, *, precision: str = "auto") -> None:
        self.size, self.precision = size, precision
        self._loaded: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._users: dict[int, int] = {}  # messages answering with each loaded model (they take turns: baton.py)

    def get(self, folder: Path, name: str) -> Any:
        """The CheckpointModel of ``folder``; ServingError 404 if it is gone, 409 if it cannot be served."""
        try:
            info = folder.stat()
        except OSError:
            message = f"model {name!r}: its checkpoint is gone (pruned by training)"
            raise ServingError(404, message, "model_not_found") from None
        from service.backends.transformers.inference import CheckpointModel

        key = (str(folder), info.st_mtime_ns, info.st_ino)
        if key not in self._loaded and (swapped := self._swap_into_idle(key, folder)) is not None:
            return swapped
        return self._load(key, name, lambda: CheckpointModel(folder, precision=self.precision))

    def _swap_into_idle(self, key: tuple[str, int, int], folder: Path) -> Any:
        """A loaded model that no request is using, given ``folder``'s adapter in place of its own (the next step of
        the same training: the base stays), now cached as ``folder``'s; None if none takes it."""
        for old_key, loaded in reversed(self._loaded.items()):
            if self._users.get(id(loaded), 0) == 0 and loaded.takes(folder):
                loaded.swap(folder)
                del self._loaded[old_key]
                self._loaded[key] = loaded
                return loaded
        return None

    def hold(self, model: Any) -> None:
        """``model`` is answering a message until ``release``: no other checkpoint is swapped into it meanwhile."""
        self._users[id(model)] = self._users.get(id(model), 0) + 1

    def release(self, model: Any) -> None:
        if (count := self._users.get(id(model), 0) - 1) > 0:
            self._users[id(model)] = count
        else:
            self._users.pop(id(model), None)

    def base(self, base_model: str, cache_dir: Path, name: str) -> Any:
        """The base model ``base_model`` alone (converted into ``cache_dir`` once, as training does)."""
        from service.backends.transformers.inference import CheckpointModel
        from service.backends.transformers.models import resolve_base_model

        def load() -> Any:
            return CheckpointModel.of_base(resolve_base_model(base_model, cache_dir), precision=self.precision)

        return self._load(("base", base_model, 0), name, load)

    def _load(self, key: tuple[str, Any, int], name: str, load: Any) -> Any:
        from service.backends.transformers.inference import NotServable  # MODEL_MODULE

        if key in self._loaded:
            self._loaded.move_to_end(key)
            return self._loaded[key]
        try:
            loaded = load()
        except NotServable as exc:
            raise ServingError(409, f"model {name!r} cannot be served: {exc}", "model_not_servable") from None
        except Exception:  # a corrupt checkpoint: the log has the traceback, the client a reason without paths
            logger.exception("loading the checkpoint %s failed", key[1] if key[0] == "base" else key[0])
            message = f"model {name!r}: its checkpoint could not be loaded"
            raise ServingError(409, message, "model_not_servable") from None
        self._loaded[key] = loaded
        while len(self._loaded) > self.size:
            self._loaded.popitem(last=False)
        return loaded


def answer(
    message: dict[str, Any], checkpoints: Checkpoints, cancelled: threading.Event, work: Work
) -> dict[str, Any]:
    """The reply to one ``complete`` message, worked on while ``work`` holds the model: its members (one caller's
    requests on one checkpoint) decoded together, each prompt's size checked before any forward pass. A member the
    template or the bounds refuse gets its own error; the checkpoint failing to load is every member's."""
    reply: dict[str, Any] = {"id": message["id"]}
    if cancelled.is_set():
        return reply | {"cancelled": True}
    members = message["members"]
    try:
        if message.get("folder") is None:
            model = checkpoints.base(message["base_model"], Path(message["cache_dir"]), members[0]["model"])
        else:
            model = checkpoints.get(Path(message["folder"]), members[0]["model"])
        checkpoints.hold(model)
        try:
            answers = _answers(model, message, cancelled, work)
        finally:
            checkpoints.release(model)
    except ServingError as exc:
        return reply | {"error": _error(exc)}
    except Exception:
        logger.exception("a chat completion failed")
        return reply | {"error": {"status": 500, "message": "the model failed on this request", "code": "server_error"}}
    return reply | ({"cancelled": True} if cancelled.is_set() else {"answers": answers})


def _answers(model: Any, message: dict[str, Any], cancelled: threading.Event, work: Work) -> list[dict[str, Any]]:
    """Each member's ``{"body"}`` or ``{"error"}``, the members the bounds admit decoded as one batch."""
    bounds = Bounds(**message["bounds"])
    answers: list[dict[str, Any]] = [{} for _ in message["members"]]
    admitted = []
    for index, member in enumerate(message["members"]):
        try:
            request = ChatCompletionRequest.model_validate(member["request"])
            sampling = model.sampling_request(request, default_max_tokens=message["default_max_tokens"])
            bounds.check_prompt(prompt_tokens=len(sampling.prompt_ids), n=sampling.n)
        except ServingError as exc:
            answers[index] = {"error": _error(exc)}
            continue
        admitted.append((index, request, sampling, member["model"]))
    started_s = work.share()  # loading the checkpoint is not the requests' sampling time

    def should_stop() -> bool:
        return cancelled.is_set() or work.share() - started_s > bounds.deadline_s

    bodies = model.complete_many([item[1:] for item in admitted], should_stop=should_stop)
    for (index, *_), body in zip(admitted, bodies):
        answers[index] = {"body": body}
    return answers


def _error(exc: ServingError) -> dict[str, Any]:
    return {"status": exc.status, "message": exc.message, "code": exc.code}


def read_requests(source: IO[str], work: queue.Queue[dict[str, Any]], cancels: dict[int, threading.Event]) -> None:
    """Queue each ``complete`` and flag each ``cancel`` as they arrive; at the end of input, exit (the API is gone)."""
    for line in source:
        message = json.loads(line)
        if message["op"] == "complete":
            cancels[message["id"]] = threading.Event()
            work.put(message)
        elif (flag := cancels.get(message["id"])) is not None:
            flag.set()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="artsvc-inference")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--cpu-policy", choices=("idle", "nice"), required=True)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--precision", choices=("auto", "bfloat16", "float32"), default="auto")
    args = parser.parse_args(argv)
    if not settle_as_child(parent=args.parent, cpu_policy=args.cpu_policy, nice=args.nice):
        return
    logging.basicConfig(level=logging.WARNING, format="artsvc inference: %(levelname)s %(name)s: %(message)s")
    replies = os.fdopen(os.dup(1), "w")  # the protocol's own; a library that prints writes to stderr
    os.dup2(2, 1)
    work: queue.Queue[dict[str, Any]] = queue.Queue()
    cancels: dict[int, threading.Event] = {}
    threading.Thread(target=read_requests, args=(sys.stdin, work, cancels), daemon=True).start()
    threading.Thread(target=importlib.import_module, args=(MODEL_MODULE,), daemon=True).start()  # torch, while idle
    checkpoints, baton, writing = Checkpoints(precision=args.precision), Baton(), threading.Lock()

    def serve(message: dict[str, Any]) -> None:
        with baton.held() as model_time:
            reply = answer(message, checkpoints, cancels[message["id"]], model_time)
        cancels.pop(message["id"], None)
        with writing:
            replies.write(json.dumps(reply) + "\n")
            replies.flush()

    while True:
        message = work.get()
        threading.Thread(target=serve, args=(message,), name=f"request-{message['id']}", daemon=True).start()


if __name__ == "__main__":
    main()
