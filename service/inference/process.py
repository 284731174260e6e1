"""The API's side of the inference process (service/inference/child.py): started on first use, started again on the
next use after it died or was closed.

Messages are JSON lines on the child's stdin; a thread per child reads its replies and resolves each on the event
loop that asked. Should the child die (killed, out of memory), what it was answering gets 503 and the next request
starts a new one. It answers one message at a time: the caller decides which goes next (service/inference/turns.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from service.settings import Settings

DIED = {"status": 503, "message": "the inference process stopped while answering; retry", "code": "inference_restarted"}


@dataclass
class _Child:
    popen: subprocess.Popen[str]
    pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[dict[str, Any]]]] = field(default_factory=dict)


class InferenceProcess:
    """A child process answering chat completions at the workers' CPU policy, on ``threads`` torch threads, its base
    models in ``precision`` (Settings.precision)."""

    def __init__(self, *, cpu_policy: str, nice: int, threads: int, precision: str = "auto") -> None:
        self._command = [
            sys.executable, "-m", "service.inference.child",
            "--parent", str(os.getpid()), "--cpu-policy", cpu_policy, "--nice", str(nice), "--precision", precision,
        ]  # fmt: skip
        threads_env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        quiet = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # no loading bars in the server's log
        self._env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, **threads_env, **quiet}  # service/cpu.py: passive
        self._child: _Child | None = None
        self._lock = threading.Lock()  # the child, its pending replies and its stdin, shared with the reader threads
        self._ids = itertools.count()

    @classmethod
    def of(cls, settings: Settings) -> InferenceProcess:
        return cls(cpu_policy=settings.worker_cpu_policy, nice=settings.worker_nice, threads=settings.inference_threads,
                   precision=settings.precision)  # fmt: skip

    @property
    def pid(self) -> int | None:
        """The running child's process id; None before the first use and after it died."""
        child = self._child
        return child.popen.pid if child is not None and child.popen.poll() is None else None

    def start(self) -> None:
        """Start the child now if none runs (the next request does otherwise)."""
        with self._lock:
            self._running()

    def submit(self, message: dict[str, Any]) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """Send a ``complete`` message (starting the child if none runs); its id and the future of its reply."""
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        with self._lock:
            child = self._running()
            message_id = next(self._ids)
            child.pending[message_id] = (asyncio.get_running_loop(), reply)
            self._send(child, {**message, "op": "complete", "id": message_id})
        return message_id, reply

    def cancel(self, message_id: int) -> None:
        """Ask the child to stop answering ``message_id``: it replies ``cancelled`` before its next token."""
        with self._lock:
            child = self._child
            if child is not None and message_id in child.pending:
                self._send(child, {"op": "cancel", "id": message_id})

    def close(self) -> None:
        """Kill the child (it holds nothing to save); what it was answering gets 503, the next use starts another."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.popen.kill()
            child.popen.wait()

    def _running(self) -> _Child:
        if self._child is None or self._child.popen.poll() is not None:
            started: queue.Queue[_Child | BaseException] = queue.Queue(maxsize=1)
            threading.Thread(target=self._start_and_read, args=(started,), name="inference", daemon=True).start()
            child = started.get()
            if isinstance(child, BaseException):
                raise child
            self._child = child
        return self._child

    def _start_and_read(self, started: queue.Queue[_Child | BaseException]) -> None:
        """Start the child, then read its replies until it ends, on this one thread: Linux sends the child its
        parent-death signal when the thread that started it ends, so that thread must outlive it."""
        try:
            popen = subprocess.Popen(
                self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env, text=True, bufsize=1
            )
        except BaseException as exc:  # handed to the caller, who raises it
            started.put(exc)
            return
        child = _Child(popen)
        started.put(child)
        self._read(child)

    def _send(self, child: _Child, message: dict[str, Any]) -> None:
        try:
            child.popen.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
            child.popen.stdin.flush()  # type: ignore[union-attr]
        except OSError:  # it died: its reader answers what it was sent
            pass

    def _read(self, child: _Child) -> None:
        for line in child.popen.stdout:  # type: ignore[union-attr]
            reply = json.loads(line)
            with self._lock:
                waiting = child.pending.pop(reply["id"], None)
            if waiting is not None:
                _resolve(*waiting, reply)
        child.popen.wait()
        with self._lock:
            if self._child is child:
                self._child = None
            left, child.pending = child.pending, {}
        for message_id, waiting in left.items():
            _resolve(*waiting, {"id": message_id, "error": DIED})


def _resolve(loop: asyncio.AbstractEventLoop, reply: asyncio.Future[dict[str, Any]], value: dict[str, Any]) -> None:
    def settle() -> None:
        if not reply.done():
            reply.set_result(value)

    with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits any more
        loop.call_soon_threadsafe(settle)
