"""The API as tests meet it: the real app on a migrated store (SQLite, then PostgreSQL), real tokens,
an in-process client for plain request/response tests and a uvicorn server on loopback where it matters;
and worker processes (``artsvc worker``) on the same store where jobs must run."""

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

from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from service.store.tables import Role
from tests.service.processes import WorkerProcess, environment

MAX_BODY_BYTES = 16 * 1024  # the tests' body limit, small enough to pass cheaply
TINY_BASE_MODEL = "embedded/char-gpt-0.2m"  # the smallest policy, which tests train with client tokens too
LOCAL_URL = "http://localhost"  # an in-process client of local mode names a loopback Host (service/api/hosts.py)


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
def serve(app: FastAPI, **config: object) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` served by uvicorn (with ``config``) on a free loopback port, in a thread, for the block: its base URL and
    the server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
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


@pytest.fixture
def start_worker(engine, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """``start_worker(*args, **env)``: a worker process on the test's store and data folder, with these arguments
    and ``ARTSVC_*`` variables; any still running are killed at the end."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        database_url = engine.url.render_as_string(hide_password=False)
        env = environment(database_url=database_url, data_dir=tmp_path / "data", **env)
        worker = WorkerProcess(*args, env=env, log_path=tmp_path / f"worker-{len(started) + 1}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
