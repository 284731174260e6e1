"""Shared fixtures. Tests use the real parts: real SQLite files, a real loopback HTTP server.

Every test has a time limit (``DEFAULT_TIMEOUT_S`` unless it says otherwise with ``@pytest.mark.timeout``, or the run
with ``--timeout``/``PYTEST_TIMEOUT``): a hung test fails instead of hanging CI."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from service.process_env import apply_process_defaults

apply_process_defaults()  # as `artsvc` does, before anything imports litellm or tqdm
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # tests share the cores: no process's threads spin (service/cpu.py)
if os.environ.get("PYTEST_XDIST_WORKER"):  # one torch thread per test process (and the servers it starts): two
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # processes with two threads each on two cores only thrash

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from service.store import db as store_db

pytest_plugins = ["tests.tiny_lm"]  # ``tiny_lm``: a tiny Llama with SmolLM2's tokenizer, built once a session

DEFAULT_TIMEOUT_S = 600  # far past any unmarked test, even on a busy machine; longer ones carry their own mark


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout reads its settings
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout") is None and not os.environ.get("PYTEST_TIMEOUT") and not config.getini("timeout"):
        config.option.timeout = DEFAULT_TIMEOUT_S


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first: pytest-xdist hands the first tests to a process at once, so the longest test
    starts at the beginning of the run instead of holding up its end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


POSTGRES_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _postgres(statement: str) -> None:
    admin = create_engine(f"{POSTGRES_SERVER}/test", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(statement))
    finally:
        admin.dispose()


class MigratedTemplates:
    """Databases migrated once a session (on first use) that tests needing a migrated store get copies of:
    a file copy for SQLite, ``CREATE DATABASE ... TEMPLATE`` for PostgreSQL. The migrations themselves are
    tested on empty databases (tests/service/test_store.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._sqlite: Path | None = None
        self._postgres: str | None = None

    def sqlite_copy(self, path: Path) -> None:
        if self._sqlite is None:
            template = self.folder / "template.db"
            store_db.upgrade(f"sqlite:///{template}")
            self._sqlite = template
        for suffix in ("", "-wal"):  # the last connection to close folds the write-ahead log in; should one remain
            source = self._sqlite.with_name(self._sqlite.name + suffix)
            if source.exists():
                shutil.copyfile(source, path.with_name(path.name + suffix))

    def postgres_template(self) -> str:
        if self._postgres is None:
            name = f"artsvc_template_{uuid.uuid4().hex[:10]}"
            _postgres(f'CREATE DATABASE "{name}"')
            self._postgres = name  # dropped at the end of the session even if the migration fails
            store_db.upgrade(f"{POSTGRES_SERVER}/{name}")
        return self._postgres

    def drop(self) -> None:
        if self._postgres is not None:
            _postgres(f'DROP DATABASE IF EXISTS "{self._postgres}" WITH (FORCE)')


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory):
    templates = MigratedTemplates(tmp_path_factory.mktemp("templates"))
    yield templates
    templates.drop()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def store(sqlite_url) -> Engine:
    """A migrated SQLite store in a temporary folder."""
    store_db.upgrade(sqlite_url)
    engine = store_db.make_engine(sqlite_url)
    yield engine
    engine.dispose()


def _postgres_url(templates: MigratedTemplates, *, migrated: bool) -> str:
    """A fresh database on the local PostgreSQL server (a copy of the migrated template if ``migrated``), or a skip
    if there is no server."""
    name = f"artsvc_test_{uuid.uuid4().hex[:10]}"
    try:
        template = f' TEMPLATE "{templates.postgres_template()}"' if migrated else ""
        _postgres(f'CREATE DATABASE "{name}"{template}')
    except OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {exc.orig}")
    return f"{POSTGRES_SERVER}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path, migrated_templates):
    """A database: a SQLite file, then a fresh PostgreSQL database (skipped if none is reachable).

    It is empty, unless the test also uses ``engine``: then it is already migrated (a copy of a database migrated
    once a session), which saves each test the migrations. Tests use only one of the two PostgreSQL-or-SQLite
    variants where nothing about the database is at stake: see tests/databases.py."""
    migrated = "engine" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        if migrated:
            migrated_templates.sqlite_copy(path)
        yield f"sqlite:///{path}"
        return
    url = _postgres_url(migrated_templates, migrated=migrated)
    yield url
    _postgres(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


@pytest.fixture
def engine(database_url) -> Engine:
    """A migrated store on ``database_url`` (SQLite, then PostgreSQL)."""
    store_db.upgrade(database_url)  # a no-op on the migrated copy ``database_url`` gives a test that uses ``engine``
    engine = store_db.make_engine(database_url)
    yield engine
    engine.dispose()
