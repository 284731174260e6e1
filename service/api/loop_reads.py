"""The event loop's own database connection, kept open between its keyed reads (service/api/deps.py ``read_now``).

A py-spy profile of ``GET /v1/jobs/{id}`` under load put 15% of the loop's time in taking a connection from the pool
and giving it back (pool bookkeeping, the reset), twice a request, as much as running the two reads. The loop runs
one read at a time, so it needs no pool: it keeps one connection, and each read is a transaction of its own, so the
next read sees everything committed since and PostgreSQL holds no snapshot between requests. On PostgreSQL the
connection is in autocommit: a read is one round trip, not three (BEGIN, the query, ROLLBACK), and a GET's two reads
held the loop 443 us instead of 973 us on loopback. SQLite's driver begins no transaction for a read, and autocommit
there only adds SQLAlchemy's bookkeeping (69 against 49 us), so there each read ends with a rollback, which is free.
A connection the database dropped is invalidated by SQLAlchemy when a read fails, and the read runs again on a fresh
one (no pre-ping per read, as a pool's checkout would cost); if even the rollback fails, the connection is discarded
and the next read opens another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

T = TypeVar("T")


class LoopReads:
    """Reads on one connection of ``engine``, opened at the first read (a store down at start-up delays nothing)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine if engine.dialect.name == "sqlite" else engine.execution_options(isolation_level="AUTOCOMMIT")
        self._connection: Connection | None = None

    def run(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """``fn(connection, **kwargs)``, then the read's transaction ended; never a write. A read that finds the
        connection dropped (a database restarted or failed over) runs once more on a fresh one: it only reads."""
        try:
            return self._read(fn, kwargs)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            return self._read(fn, kwargs)

    def _read(self, fn: Callable[..., T], kwargs: dict[str, Any]) -> T:
        if self._connection is None:
            self._connection = self.engine.connect()
        connection = self._connection
        try:
            return fn(connection, **kwargs)
        finally:
            try:
                connection.rollback()
            except SQLAlchemyError:  # the connection is beyond use: the next read opens another
                self._connection = None
                with contextlib.suppress(SQLAlchemyError):
                    connection.invalidate()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
