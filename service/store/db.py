"""Engine creation and schema migrations.

SQLite gets WAL and a busy timeout so a reader never blocks the training loop; any other
SQLAlchemy URL (PostgreSQL in production) is used as given. The schema is Alembic's alone.

The pool is bounded and its wait short: a request that finds no free connection fails fast (the API
answers 503) instead of queueing for half a minute. The API sizes its request threads to the pool
(service/app.py), so a connection is normally free for every thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import create_engine

if TYPE_CHECKING:  # Alembic is imported where a migration or check needs it: `artsvc submit` and `watch` never do
    from alembic.config import Config

# The Alembic scripts as a package resource (package data, pyproject.toml): Alembic finds them with importlib.resources,
# in any install, not only in a checkout.
MIGRATIONS = "service.store:migrations"


SQLITE_LOCK_WAIT_S = 30.0  # a writer waits this long for another's transaction before "database is locked"


class StoreError(RuntimeError):
    """The store cannot be used: unreachable, unwritable, or not migrated."""


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 10, pool_timeout_s: float = 30.0, wait_s: float | None = None
) -> Engine:
    """An engine for ``url`` with at most ``pool_size + max_overflow`` connections, waiting ``pool_timeout_s``
    for a free one (sqlalchemy.exc.TimeoutError beyond); for SQLite the file's folder is created (clear error if
    it can't be). With ``wait_s`` a statement gives up after that long (PostgreSQL's statement timeout, SQLite's
    wait for a lock, else 30 s). The defaults are SQLAlchemy's, for the command line; the API passes its settings."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        bounded = wait_s is not None and parsed.get_backend_name() == "postgresql"
        options = {"options": f"-c statement_timeout={round(wait_s * 1000)}", "connect_timeout": max(1, round(wait_s))} if bounded else {}
        return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=max_overflow,
                             pool_timeout=pool_timeout_s, connect_args=options)  # fmt: skip
    pool: dict[str, Any] = {}  # an in-memory database lives in one connection: SQLAlchemy's own pool for it
    if parsed.database and parsed.database != ":memory:":
        folder = Path(parsed.database).expanduser().resolve().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the database folder {folder}: {exc.strerror}") from None
        # A SQLite connection is a file handle, not a server's slot: every connection the pool may open is kept
        # (no overflow closed and reopened under load, re-running the pragmas); the same total and wait.
        pool = {"pool_size": pool_size + max_overflow, "max_overflow": 0, "pool_timeout": pool_timeout_s}
    wait_s = SQLITE_LOCK_WAIT_S if wait_s is None else wait_s
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": wait_s}, **pool)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={round(wait_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


@contextlib.contextmanager
def one_writer(engine: Engine) -> Iterator[None]:
    """Around a write transaction on a request thread: on SQLite, the API's writers take turns, in this process on a
    lock and across the API's processes (``serve --api-processes``) on an advisory lock of a file beside the database.

    SQLite lets one connection write at a time, and a connection that finds the file locked waits in SQLite's busy
    handler, which sleeps 1, 2, 5, 10 ... 100 ms between tries: fifteen request threads submitting at once made 33
    jobs a second, each commit taking 0.3 ms. Queued on a lock, each writer starts the moment the one before it
    commits; the thread lock comes first, so one thread a process waits on the file. Only a speed-up: correctness
    stays with SQLite's own lock (the workers still meet it). PostgreSQL locks rows, not the database: nothing to do."""
    turn = _turn_of(engine)
    if turn is None:
        yield
        return
    with turn.thread_lock:
        if turn.file is not None:
            fcntl.flock(turn.file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if turn.file is not None:
                fcntl.flock(turn.file, fcntl.LOCK_UN)


@contextlib.contextmanager
def writer_turn_now(engine: Engine) -> Iterator[bool]:
    """``one_writer``'s turn if nobody holds it this instant (True, held until the block ends), else False at once:
    for the event loop, which must never wait for it. Only SQLite has turns: False on any other database."""
    with contextlib.ExitStack() as held:
        yield _take_turn_now(_turn_of(engine), held)


def _take_turn_now(turn: _WriterTurn | None, held: contextlib.ExitStack) -> bool:
    if turn is None or not turn.thread_lock.acquire(blocking=False):
        return False
    held.callback(turn.thread_lock.release)
    if turn.file is not None:
        try:
            fcntl.flock(turn.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another API process's turn
            held.close()
            return False
        held.callback(fcntl.flock, turn.file, fcntl.LOCK_UN)
    return True


def _turn_of(engine: Engine) -> _WriterTurn | None:
    """The writers' turn of ``engine``'s SQLite database (shared by every engine on the same file); None elsewhere."""
    return _turn_of_database(engine.url.database or "") if engine.dialect.name == "sqlite" else None


@functools.cache
def _turn_of_database(database: str) -> _WriterTurn:
    """The turn of SQLite's ``database`` as a URL names it, its path resolved once (a resolve costs system calls)."""
    return _sqlite_writer(sqlite_file(database))


@functools.cache
def sqlite_file(database: str) -> Path | None:
    """The file of SQLite's ``database`` as a URL names it, resolved; None for an in-memory database."""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    return None if in_memory else Path(database).expanduser().resolve()


@dataclass(frozen=True)
class _WriterTurn:
    thread_lock: threading.Lock
    file: int | None  # an open descriptor of ``<database>.writer-lock``; None for an in-memory database


@functools.cache
def _sqlite_writer(database: Path | None) -> _WriterTurn:
    """The turn of the database file ``database`` (None: of in-memory databases), kept for the process's life."""
    if database is None:
        return _WriterTurn(threading.Lock(), None)
    lock_file = database.with_name(database.name + ".writer-lock")
    return _WriterTurn(threading.Lock(), os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", MIGRATIONS)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Migrate the database at ``url`` to the newest schema (idempotent)."""
    from alembic import command

    try:
        command.upgrade(alembic_config(url), "head")
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot migrate the database at {make_url(url).render_as_string()}: {exc.orig or exc}") from None


def check_migrated(engine: Engine) -> None:
    """Raise StoreError, saying what to run, unless the schema is at the newest revision."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(str(engine.url))).get_current_head()
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot reach the database: {exc.orig or exc}") from None
    if current != head:
        raise StoreError(f"the database is at schema revision {current or 'none'}, not {head}: run `artsvc db upgrade`")
