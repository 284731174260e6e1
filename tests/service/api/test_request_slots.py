"""Request slots on a real loopback server, against the floods of issue 30: a token's share is one whatever the
spelling of its header or however it logs in, made-up tokens share one small pool of their own, and a body sent
slowly gets 408 and gives its slot back, while another tenant and ``/healthz`` are answered throughout.

Each slow request is a raw socket that sends its head and one byte of a longer body: it holds a slot from its head
on. The server's caps are small (``SLOTS``) and its body timeout short, so a handful of sockets pass every limit."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest
from sqlmodel import Session

from service.app import create_app
from service.auth import create_browser_session
from service.api.browser_auth import SESSION_COOKIE
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.api.test_limits import read_response
from tests.service.conftest import MAX_BODY_BYTES, serve

SLOTS = {
    "max_concurrent_requests": 12,
    "max_concurrent_requests_per_caller": 4,
    "max_concurrent_unauthenticated_requests": 2,
}
BODY_TIMEOUT_S = 1.0
SCHEMES = ("Bearer", "bearer", "BEARER", "BeArEr")


@pytest.fixture
def base(settings, engine) -> Iterator[str]:
    app = create_app(settings.model_copy(update={**SLOTS, "request_body_timeout_s": BODY_TIMEOUT_S}), engine=engine)
    with serve(app) as (url, _):
        yield url


@contextmanager
def slow_bodies(base: str, headers: list[dict[str, str]], *, length: int = 1000) -> Iterator[list[socket.socket]]:
    """One raw connection per ``headers``: a ``POST /v1/jobs`` head declaring ``length`` bytes, then one byte."""
    host, port = base.removeprefix("http://").split(":")
    with ExitStack() as stack:
        sockets = []
        for extra in headers:
            sock = stack.enter_context(socket.create_connection((host, int(port)), timeout=BODY_TIMEOUT_S + 3))
            lines = [f"{name}: {value}" for name, value in {**extra, "Content-Length": length}.items()]
            head = "\r\n".join(["POST /v1/jobs HTTP/1.1", f"Host: {host}", "Content-Type: application/json", *lines])
            sock.sendall(head.encode() + b"\r\n\r\n{")
            sockets.append(sock)
        yield sockets


def first_refusal(http: httpx.Client, headers: dict[str, str]) -> httpx.Response:
    """The first refused ``GET /v1/jobs``, polling while the slow requests' heads arrive (or the last answer)."""
    for _ in range(40):
        response = http.get("/v1/jobs", headers=headers)
        if response.status_code in (429, 503):
            break
        time.sleep(0.05)
    return response


def bearer(headers: dict[str, str], scheme: str) -> dict[str, str]:
    return {"Authorization": headers["Authorization"].replace("Bearer", scheme, 1)}


def test_a_token_has_one_share_whatever_its_schemes_spelling_or_its_dashboard_session(base, engine):
    owner, tenant = seeding.principal(engine, name="flooder")
    _, other = seeding.principal(engine, name="other")
    with Session(engine) as session:
        _, cookie = create_browser_session(session, token=tenant["Authorization"].split()[1], ttl_s=600)
        session.commit()
    share = SLOTS["max_concurrent_requests_per_caller"]
    with httpx.Client(base_url=base, timeout=10) as http, slow_bodies(base, [tenant] * share):
        refused = first_refusal(http, tenant)
        assert refused.status_code == 429 and "ARTSVC_MAX_CONCURRENT_REQUESTS_PER_CALLER" in refused.json()["detail"]
        for scheme in SCHEMES[1:]:
            assert http.get("/v1/jobs", headers=bearer(tenant, scheme)).status_code == 429, scheme
        http.cookies.set(SESSION_COOKIE, cookie)
        assert http.get("/v1/jobs").status_code == 429  # the session stands for the same token
        http.cookies.clear()
        assert http.get("/v1/jobs", headers=other).status_code == 200


def test_made_up_tokens_share_one_small_pool_and_never_the_tenants_slots(base, engine):
    """Three times the server's cap of slow requests with made-up tokens, in every spelling of the scheme: they
    hold only the unauthenticated pool, and a tenant's requests are served."""
    _, tenant = seeding.principal(engine)
    made_up = [{"Authorization": f"{SCHEMES[n % 4]} artsvc_made-up-{n}"} for n in range(3 * SLOTS["max_concurrent_requests"])]
    with httpx.Client(base_url=base, timeout=10) as http, slow_bodies(base, made_up):
        refused = first_refusal(http, {"Authorization": "Bearer artsvc_one-more"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "ARTSVC_MAX_CONCURRENT_UNAUTHENTICATED_REQUESTS" in refused.json()["detail"]
        assert http.get("/v1/jobs").status_code == 503  # no credential at all: the same pool
        assert http.get("/v1/jobs", headers=tenant).status_code == 200
        assert http.get("/healthz").status_code == 200


@sqlite_only
def test_a_slow_body_gets_408_and_its_slot_back_while_others_are_served(base, engine):
    """One tenant's slow requests, twice the server's cap of them, and another's declaring a body past the size
    limit: the first ``share`` of the one and the other hold slots and the rest are refused, a third tenant and
    /healthz are served meanwhile, and after the body timeout each held request gets 408 and a closed connection,
    and the tenant is served again."""
    _, tenant = seeding.principal(engine, name="slow")
    _, big = seeding.principal(engine, name="slow and large")
    _, other = seeding.principal(engine, name="other")
    share = SLOTS["max_concurrent_requests_per_caller"]
    with httpx.Client(base_url=base, timeout=10) as http:
        with slow_bodies(base, [tenant] * (2 * SLOTS["max_concurrent_requests"])) as held:
            with slow_bodies(base, [big], length=2 * MAX_BODY_BYTES) as [oversized]:
                assert first_refusal(http, tenant).status_code == 429
                assert http.get("/v1/jobs", headers=other).status_code == 200
                assert http.get("/healthz").status_code == 200
                answers = [(read_response(sock), sock) for sock in [*held, oversized]]
                timed_out = [(response, sock) for response, sock in answers if response.startswith(b"HTTP/1.1 408")]
                assert len(timed_out) == share + 1, [response[:12] for response, _ in answers]
                assert {response[:12] for response, _ in answers} == {b"HTTP/1.1 408", b"HTTP/1.1 429"}
                for response, sock in timed_out:
                    assert b"connection: close" in response.lower() and b"ARTSVC_REQUEST_BODY_TIMEOUT_S" in response
                    assert sock.recv(1) == b""  # closed by the server
        assert http.get("/v1/jobs", headers=tenant).status_code == 200
