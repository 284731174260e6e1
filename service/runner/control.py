"""How the process running a job steers it, the same for training and evaluation jobs: progress callbacks,
a stop at the next boundary (shutdown), and writes only while it still holds the job (a worker's lease).

The lease fence: every write of a running job goes through :func:`fenced`, whose transaction first asks
``hooks.holds_job`` (a worker renews its lease there: an UPDATE of the job's row that must match). That
row then stays locked (PostgreSQL) or the database write-locked (SQLite) until the commit, so no other
worker can take the job over between the check and the writes. A job taken over raises :class:`LeaseLost`
with nothing written; the new owner's rows stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.store.tables import Alert

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
