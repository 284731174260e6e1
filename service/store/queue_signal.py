"""Wakes idle workers when a job enters the queue, so its claim does not wait for the next poll.

The poll (``ARTSVC_POLL_SECONDS``) stays what guarantees a claim; this makes the common case prompt (ART's client
waits on every batch it posts: half a poll each time was a tenth of a small step). PostgreSQL: a ``NOTIFY`` in the
queuing transaction, delivered at its commit to every worker that LISTENs, on any machine. SQLite, one machine by
nature: the queuing commit bumps the modification time of ``<database>.queued``, which idle workers read every
``SQLITE_CHECK_S`` (a stat costs microseconds and holds no connection).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.store.db import sqlite_file

log = logging.getLogger(__name__)

CHANNEL = "artsvc_queue"
SQLITE_CHECK_S = 0.05  # how often an idle worker reads the SQLite signal's time
RECONNECT_S = 5.0  # a lost LISTEN connection is opened again this long after; the poll covers the gap


def announce(session: Session) -> None:
    """Tell idle workers that a job can be claimed, once ``session``'s transaction commits (not before: a worker
    woken earlier would not see the job)."""
    engine = session.get_bind()
    if engine.dialect.name == "postgresql":
        session.connection().exec_driver_sql(f"NOTIFY {CHANNEL}")
    elif (signal := _signal_file(engine)) is not None:
        event.listen(session, "after_commit", lambda _session: _touch(signal), once=True)


async def watch(engine: Engine, queued: asyncio.Event) -> None:
    """Set ``queued`` whenever a job is announced, until cancelled (an in-memory SQLite database has no signal)."""
    if engine.dialect.name == "postgresql":
        await _listen(engine, queued)
    elif (signal := _signal_file(engine)) is not None:
        await _stat(signal, queued)


def _signal_file(engine: Engine) -> Path | None:
    database = sqlite_file(engine.url.database or "")
    return None if database is None else database.with_name(database.name + ".queued")


def _touch(signal: Path) -> None:
    try:
        signal.touch()
    except OSError as exc:  # workers find the job at their next poll
        log.warning("cannot signal the queue through %s: %s", signal, exc)


def _mtime(signal: Path) -> int | None:
    try:
        return os.stat(signal).st_mtime_ns
    except OSError:
        return None


async def _stat(signal: Path, queued: asyncio.Event) -> None:
    seen = _mtime(signal)
    while True:
        await asyncio.sleep(SQLITE_CHECK_S)
        if (now := _mtime(signal)) != seen:
            seen = now
            queued.set()


async def _listen(engine: Engine, queued: asyncio.Event) -> None:
    """LISTEN on a connection of its own (not the pool's: it is held for the worker's life)."""
    import psycopg  # the PostgreSQL driver, installed with the service

    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as connection:
                await connection.execute(f"LISTEN {CHANNEL}")
                queued.set()  # a job queued while this connection was down is claimable now
                async for _notice in connection.notifies():
                    queued.set()
        except psycopg.Error as exc:
            log.warning("cannot LISTEN for queued jobs (polling meanwhile): %s", exc)
        await asyncio.sleep(RECONNECT_S)
