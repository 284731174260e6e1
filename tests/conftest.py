"""Shared fixtures. Tests use the real parts: real SQLite files, a real loopback HTTP server."""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TQDM_DISABLE", "1")

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from service.store import db as store_db


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


POSTGRES_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _postgres_url() -> str:
    """A fresh database on the local PostgreSQL server, or a skip if there is none."""
    try:
        admin = create_engine(f"{POSTGRES_SERVER}/test", isolation_level="AUTOCOMMIT")
        name = f"artsvc_test_{uuid.uuid4().hex[:10]}"
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
    except OperationalError as exc:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {exc.orig}")
    return f"{POSTGRES_SERVER}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """An empty database: a SQLite file, then a fresh PostgreSQL database (skipped if none is reachable)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    url = _postgres_url()
    yield url
    admin = create_engine(f"{POSTGRES_SERVER}/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def engine(database_url) -> Engine:
    """A migrated store on ``database_url`` (SQLite, then PostgreSQL)."""
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    yield engine
    engine.dispose()
