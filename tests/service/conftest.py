"""The API as tests meet it: the real app on a migrated store (SQLite, then PostgreSQL), real tokens,
an in-process client for plain request/response tests and a uvicorn server on loopback where it matters."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.api.app import create_app
from service.auth import create_token
from service.settings import Settings
from service.store.tables import Role

MAX_BODY_BYTES = 16 * 1024  # the tests' body limit, small enough to pass cheaply
TINY_BASE_MODEL = "embedded/char-gpt-0.2m"  # the smallest policy, which tests train with client tokens too


@pytest.fixture
def settings(database_url, tmp_path) -> Settings:
    data_dir = tmp_path / "data"
    return Settings(_env_file=None, database_url=database_url, data_dir=data_dir, max_body_bytes=MAX_BODY_BYTES,
                    client_base_models=[TINY_BASE_MODEL])  # fmt: skip


@pytest.fixture
def app(settings, engine) -> FastAPI:
    """The API without an in-process worker: jobs stay queued unless a test moves them."""
    return create_app(settings, engine=engine)


@pytest.fixture
def client(app) -> Iterator[TestClient]:
    with TestClient(app) as client:
        yield client


@pytest.fixture
def auth(engine) -> Callable[..., dict[str, str]]:
    """``auth(Role.client)``: the Authorization header of a fresh token of that role."""

    def make(role: Role = Role.client, name: str = "test") -> dict[str, str]:
        with Session(engine) as session:
            _, secret = create_token(session, role=role, name=name)
            session.commit()
        return {"Authorization": f"Bearer {secret}"}

    return make


@contextmanager
def serve(app: FastAPI) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` served by uvicorn on a free loopback port, in a thread, for the block: its base URL and the server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@pytest.fixture
def live_server(app) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port; yields its base URL."""
    with serve(app) as (base, _):
        yield base
