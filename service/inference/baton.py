"""Model work in the inference process for several requests at once, one at a time (service/inference/child.py).

Each request in progress runs on a thread of its own while it holds the baton; when another request waits for it, the
holder hands it on at its next stopping point (a prompt chunk or a decoded token) once it has worked ``slice_s``, and
joins the back of the line. Requests in progress (one per caller: service/inference/turns.py) thus take the model
round-robin a fraction of a second each, so a one-token chat is answered within a few slices of a flooder's long
request instead of after it. A request's deadline counts its own work only, not the time it waited for the baton.
Only one thread runs the model at a time, so torch keeps every thread the process has.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

SLICE_S = 0.25  # work a request does before it hands the model to a waiting one


class Baton:
    """A fair (first come, first served) lock over the model, with time slices."""

    def __init__(self, *, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._changed = threading.Condition()
        self._line: deque[object] = deque()
        self._holder: object | None = None

    @contextmanager
    def held(self) -> Iterator[Work]:
        """Hold the baton for one request's work; the Work it gives says how long that was and passes the baton on."""
        work = Work(self)
        work.resume()
        try:
            yield work
        finally:
            work.pause()

    def _acquire(self, ticket: object) -> None:
        with self._changed:
            self._line.append(ticket)
            self._changed.wait_for(lambda: self._holder is None and self._line[0] is ticket)
            self._line.popleft()
            self._holder = ticket

    def _release(self) -> None:
        with self._changed:
            self._holder = None
            self._changed.notify_all()

    def _contended(self) -> bool:
        return bool(self._line)  # read without the lock: a late answer only delays a hand-over by one token


class Work:
    """One request's time with the baton."""

    def __init__(self, baton: Baton) -> None:
        self.baton = baton
        self.used_s = 0.0  # seconds held before the current slice
        self._since = 0.0

    def resume(self) -> None:
        self.baton._acquire(self)
        self._since = time.monotonic()

    def pause(self) -> None:
        self.used_s += time.monotonic() - self._since
        self.baton._release()

    def share(self) -> float:
        """At a stopping point: hand the baton to a waiting request if this slice is over (and wait for it back);
        the seconds of work this request has done."""
        held = time.monotonic() - self._since
        if held >= self.baton.slice_s and self.baton._contended():
            self.pause()
            self.resume()
            held = 0.0
        return self.used_s + held
