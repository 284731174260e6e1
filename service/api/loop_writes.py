"""A submission's write right on the event loop when SQLite's write lock is free this instant; else on a request thread.

Timed inside the server under 50 connections back to back (every tenth request a ``POST /v1/jobs``, SQLite), a
submission that went to a request thread spent, at the median, 0.4 ms checking and building its job, 8 ms waiting for
the writers' turn (p99 106 ms), 2.6 ms in it for 0.3 ms of work (each statement hands the GIL back and waits up to the
interpreter's 5 ms switch interval to get it again from the busy loop), and then 30 ms, two passes of the loop, before
the route saw the result (the thread's result reaches the loop in one pass, the awaiting route in the next). Only
the turn needs a thread: SQLite's write lock may be held by a worker or another API process, and the loop must never
wait for it. So the loop tries first, without waiting: the API writers' turn if free (``one_writer``: no thread of
this process nor another API process is writing) and then ``BEGIN IMMEDIATE`` on a connection whose busy timeout is
zero, which takes SQLite's write lock or fails at once. Either refusal costs microseconds, and the submission goes to
a request thread as before. A write the loop does is the same few statements and one commit that the thread would
have done holding the GIL, except the commit's sync of SQLite's log, during which a thread lets the loop run: timed
on the loop under that load, a write took 1.1 ms (median) and 3 ms (p99), the commit 0.45 and 2.1 ms of it. The rows go
in as two Core inserts (``runs.insert_queued``): through the ORM's unit of work the same write took 1.3x as long. On a disk
whose syncs take much longer, every submission holds the loop that long: PostgreSQL is the store for such a box.

PostgreSQL takes no part: its writes wait on row locks and round trips, so they stay on the request threads.
Evaluations stay there too: resolving one reads checkpoints from disk.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from service.store import db as store_db

T = TypeVar("T")


class LoopWrites:
    """Write transactions on the store at ``url`` run on the event loop, each only if it can start without waiting."""

    def __init__(self, url: str) -> None:
        self.engine = _immediate_engine(url) if make_url(url).get_backend_name() == "sqlite" else None

    def try_now(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T | None:
        """``fn(session, *args, **kwargs)`` in a transaction that holds SQLite's write lock (``fn`` commits it); or
        None, having run nothing, when the lock cannot be had this instant or the store is not SQLite: the caller
        then does the write on a request thread, in ``one_writer``'s turn, which waits."""
        if self.engine is None:
            return None
        with store_db.writer_turn_now(self.engine) as ours:
            if not ours:
                return None
            with Session(self.engine, expire_on_commit=False) as session:
                try:
                    session.connection()  # BEGIN IMMEDIATE: SQLite's write lock now, or "database is locked" at once
                except OperationalError as exc:
                    if not _busy(exc):
                        raise
                    return None
                return fn(session, *args, **kwargs)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


def _immediate_engine(url: str) -> Engine:
    """One connection to SQLite's ``url`` whose transactions take the write lock as they begin, never waiting for it
    (SQLAlchemy's recipe for pysqlite: the driver begins nothing itself, a ``begin`` listener does)."""
    engine = store_db.make_engine(url, pool_size=1, max_overflow=0, wait_s=0)

    @event.listens_for(engine, "connect")
    def _driver_begins_nothing(dbapi_connection, _record) -> None:  # noqa: ANN001
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:  # noqa: ANN001
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _busy(exc: OperationalError) -> bool:
    """Whether SQLite refused for a lock another connection holds (SQLITE_BUSY or SQLITE_LOCKED, any extended code)."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
