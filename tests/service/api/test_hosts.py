"""DNS rebinding on a real loopback server: a page on the attacker's domain, once that name resolves to 127.0.0.1,
reaches the server with its own name in ``Host`` (and in ``Origin``). Local mode, which has no credential to check,
answers only loopback names and ``ARTSVC_TRUSTED_HOSTS``; a multi-tenant server answers those only when the setting
is given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlmodel import Session, select

from service.app import create_app
from service.store.tables import Job
from tests.databases import sqlite_only
from tests.service.conftest import serve

pytestmark = sqlite_only  # plain HTTP behaviour

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "LOCALHOST", "[::1]")


@pytest.fixture
def server(settings, engine) -> Callable[..., Iterator[tuple[httpx.Client, int]]]:
    """``server(**settings)``: a client of a loopback server with those settings, and its port."""

    @contextmanager
    def start(**update: object) -> Iterator[tuple[httpx.Client, int]]:
        app = create_app(settings.model_copy(update=update), engine=engine)
        with serve(app) as (base, _), httpx.Client(base_url=base, timeout=30) as http:
            yield http, int(base.rsplit(":", 1)[1])

    return start


def as_host(name: str, port: int) -> dict[str, str]:
    """What a browser sends for a page at ``http://name:port``, its own origin."""
    return {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}"}


def jobs(engine) -> int:
    with Session(engine) as session:
        return len(session.exec(select(Job.id)).all())


def test_local_mode_refuses_a_rebinding_domain_and_answers_loopback_names(server, engine):
    with server(local_mode=True) as (http, port):
        listed = http.get("/v1/jobs", headers=as_host("evil.example", port))
        submitted = http.post("/v1/jobs", json={"environment": "math"}, headers=as_host("evil.example", port))
        assert listed.status_code == submitted.status_code == 400
        assert "'evil.example:" in listed.json()["detail"] and "ARTSVC_TRUSTED_HOSTS" in listed.json()["detail"]
        assert jobs(engine) == 0
        for name in LOOPBACK_HOSTS:
            assert http.get("/v1/jobs", headers=as_host(name, port)).status_code == 200, name
        assert http.post("/v1/jobs", json={"environment": "math"}, headers=as_host("localhost", port)).status_code == 201


def test_trusted_hosts_are_answered_and_others_refused_in_either_mode(server):
    trusted = ["api.example.com", "*.teams.example"]
    for local_mode in (True, False):
        with server(local_mode=local_mode, trusted_hosts=trusted) as (http, port):
            for name in ("api.example.com", "API.example.com", "ml.teams.example", "localhost"):
                assert http.get("/healthz", headers=as_host(name, port)).status_code == 200, name
            for name in ("teams.example", "api.example.com.evil.example", "evil.example"):
                assert http.get("/healthz", headers=as_host(name, port)).status_code == 400, name


def test_without_trusted_hosts_a_multi_tenant_server_answers_any_host(server):
    """Tokens, not names, guard it: a rebinding page holds no token (and is refused 401 like anyone without)."""
    with server() as (http, port):
        assert http.get("/v1/jobs", headers=as_host("api.example.com", port)).status_code == 401
