"""Shared fixtures. Tests use the real parts: real SQLite files, a real loopback HTTP server."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TQDM_DISABLE", "1")

import pytest
from sqlalchemy.engine import Engine

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
