"""How the process running a job steers it, the same for training and evaluation jobs: progress callbacks,
a stop at the next boundary (shutdown), and writes only while it still holds the job (a worker's lease).

The lease fence: every write of a running job goes through :func:`fenced`, whose transaction first asks
``hooks.holds_job`` (a worker renews its lease there: an UPDATE of the job's row that must match). That
row then stays locked (PostgreSQL) or the database write-locked (SQLite) until the commit, so no other
worker can take the job over between the check and the writes. A job taken over raises :class:`LeaseLost`
with nothing written; the new owner's rows stay as they are.

Inside a long phase (a warm start, a step's rollouts, a validation) the job asks :class:`StopCheck` often: a cancel
asked through the store, or the process asking the job to stop, then takes effect within about a second, not at the
end of the phase.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.store import runs
from service.store.tables import Alert

T = TypeVar("T")
ProgressCallback = Callable[[str, dict[str, Any]], None]


def _ignore(*_: Any) -> None:
    return None


def _always(_: Session) -> bool:
    return True


@dataclass
class JobHooks:
    """How the process running a job watches and steers it (the CLI shows progress, a worker holds a lease)."""

    on_event: ProgressCallback = _ignore  # warm_start, step and validation progress, after each is stored
    should_stop: Callable[[], bool] = lambda: False  # asked at every boundary (a training step, an evaluation rollout)
    on_alert: Callable[[Sequence[Alert]], None] = _ignore  # alerts just committed (the worker posts them to a webhook)
    trajectories_per_step: int = 8  # rollouts of each step kept in the store for operators to read
    holds_job: Callable[[Session], bool] = _always  # asked first in every write transaction; False: LeaseLost


class JobInterrupted(Exception):
    """The process stopped the job at a boundary (shutdown, lost lease); nothing was recorded, it can resume."""


class LeaseLost(JobInterrupted):
    """Another worker holds the job now: this process wrote nothing more of it, and stops."""


class JobCancelled(Exception):
    """A cancel asked through the store, seen inside a long phase: the job ends cancelled now, the phase's work
    dropped (nothing of it was recorded)."""


def interrupt_if_asked(hooks: JobHooks, job_id: str) -> None:
    """At a boundary: raise JobInterrupted if the process asks the job to stop (shutdown, a lease gone stale)."""
    if hooks.should_stop():
        raise JobInterrupted(f"job {job_id} interrupted at a boundary; it resumes from its last record")


@contextmanager
def fenced(db: Engine, hooks: JobHooks, job_id: str) -> Iterator[Session]:
    """A transaction that writes a running job, committed when the block ends, only while the process holds the
    job: raises LeaseLost, writing nothing, if ``hooks.holds_job`` says another process has it."""
    with Session(db, expire_on_commit=False) as session:
        if not hooks.holds_job(session):
            session.rollback()
            raise LeaseLost(f"job {job_id} was taken over by another worker; this one stops and writes nothing")
        yield session
        session.commit()


class StopCheck:
    """Whether a running job must stop now, asked as often as a long phase likes: raises JobCancelled when a cancel
    was asked through the store (read at most every ``store_every_s``: a cancel wins over an interruption, as at a
    step boundary), else JobInterrupted when the process asks the job to stop (shutdown, a lease lost or lapsed)."""

    def __init__(self, db: Engine, hooks: JobHooks, job_id: str, *, store_every_s: float = 1.0) -> None:
        self.db, self.hooks, self.job_id, self.store_every_s = db, hooks, job_id, store_every_s
        self._read_at = float("-inf")

    def __call__(self) -> None:
        if time.monotonic() - self._read_at >= self.store_every_s and self.cancel_requested():
            raise JobCancelled(f"job {self.job_id} was cancelled")
        interrupt_if_asked(self.hooks, self.job_id)

    def cancel_requested(self) -> bool:
        """Whether a client or an operator asked to cancel the job, read from the store now."""
        self._read_at = time.monotonic()
        with Session(self.db) as session:
            return runs.get_job(session, job_id=self.job_id).cancel_requested

    async def guard(self, work: Awaitable[T], *, parts: Collection[asyncio.Task[Any]] = (), every_s: float = 0.25) -> T:
        """``work``'s result, asking this check every ``every_s`` while it runs; a stop cancels ``work`` and each of
        its ``parts`` still running (ART's gathering of groups swallows a cancel of itself and waits for its rollouts:
        the rollouts are cancelled one by one) and is raised once ``work`` has unwound."""
        task = asyncio.ensure_future(work)
        try:
            while not (await asyncio.wait({task}, timeout=every_s))[0]:
                self()
        except BaseException:
            for part in [task, *parts]:
                part.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        return task.result()
