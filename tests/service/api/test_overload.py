"""Overload on a real uvicorn server: one tenant's flood gets fast 503s (429 past its stream cap), never a stall or
a 500, while another tenant and ``/healthz`` are still answered. The server runs with a small pool and small caps
(``FLOOD_SETTINGS``), so hundreds of requests are enough to pass every limit."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.databases import sqlite_only
from tests.service.api import seeding

FLOOD_SETTINGS = {
    "db_pool_size": 2,
    "db_max_overflow": 2,
    "db_pool_timeout_s": 1.0,
    "max_concurrent_requests": 16,
    "max_concurrent_requests_per_caller": 8,
    "max_event_streams": 8,
    "max_event_streams_per_tenant": 6,
}
LIVELY_S = 10  # another tenant's request, and /healthz, answer within this even mid-flood (not the old 30-60 s)
SSE = {"Accept": "text/event-stream"}
JSON = {"Content-Type": "application/json"}
UNBOUNDED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


@pytest.fixture
def server(database_url, engine, tmp_path) -> Iterator[str]:
    """``artsvc serve --no-worker`` in a process of its own (the flood shares no interpreter with it), with
    ``FLOOD_SETTINGS``; yields its base URL."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("ARTSVC_")}
    env |= {f"ARTSVC_{key.upper()}": str(value) for key, value in FLOOD_SETTINGS.items()}
    env |= {"ARTSVC_DATABASE_URL": database_url, "ARTSVC_DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "-m", "service", "serve", "--no-worker", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            _, log = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, log = process.communicate()
    assert "Traceback" not in log, log  # nothing went unhandled: no 500s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bystander(base: str, headers: dict[str, str], job_id: str) -> list[tuple[float, httpx.Response]]:
    """Another tenant, from a thread and a client of its own: its job, /healthz, its job again, each timed."""
    answers = []
    with httpx.Client(base_url=base, timeout=60) as http:
        for path, auth in ((f"/v1/jobs/{job_id}", headers), ("/healthz", {}), (f"/v1/jobs/{job_id}", headers)):
            started = time.monotonic()
            response = http.get(path, headers=auth)
            answers.append((time.monotonic() - started, response))
    return answers


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_flood_from_one_tenant_is_refused_fast_and_others_are_still_served(server, engine):
    base = server
    a, a_headers = seeding.principal(engine, name="flooder")
    b, b_headers = seeding.principal(engine, name="bystander")
    a_job, b_job = seeding.new_job(engine, owner_id=a), seeding.new_job(engine, owner_id=b)
    statuses: Counter = Counter()
    flood_over = asyncio.Event()

    async with httpx.AsyncClient(base_url=base, limits=UNBOUNDED, timeout=60) as http:

        async def plain(index: int) -> None:
            kind = index % 3
            if kind == 0:
                response = await http.get(f"/v1/jobs/{a_job}", headers=a_headers)
            elif kind == 1:
                response = await http.get("/v1/jobs", headers=a_headers)
            else:
                response = await http.post("/v1/jobs", json={"environment": "math"}, headers=a_headers)
            statuses[response.status_code] += 1
            if response.status_code in (429, 503):
                assert response.headers["retry-after"].isdigit(), response.text

        async def stream() -> None:
            async with http.stream("GET", f"/v1/jobs/{a_job}/events", headers={**a_headers, **SSE}) as response:
                statuses[f"stream {response.status_code}"] += 1
                if response.status_code == 200:
                    await anext(response.aiter_lines())  # the stream is live: hold it until the flood ends
                    await flood_over.wait()
                else:
                    assert response.headers["retry-after"].isdigit()

        flood = [asyncio.create_task(plain(index)) for index in range(300)]
        flood += [asyncio.create_task(stream()) for _ in range(100)]
        await asyncio.sleep(0.5)  # the flood is under way
        answers = await asyncio.to_thread(bystander, base, b_headers, b_job)
        await asyncio.wait([task for task in flood[:300]])
        flood_over.set()
        await asyncio.gather(*flood)

    assert set(statuses) <= {200, 201, 429, 503, "stream 200", "stream 429", "stream 503"}, statuses
    assert statuses["stream 200"] <= FLOOD_SETTINGS["max_event_streams_per_tenant"], statuses
    for seconds, response in answers:
        assert response.status_code in (200, 503), response.text  # a 503 is an answer: retry, never a stall
        assert seconds < LIVELY_S, f"{response.request.url.path} took {seconds:.1f} s"
    assert answers[1][1].status_code == 200  # /healthz has an allowance of its own: it says the server is alive


@sqlite_only
@pytest.mark.asyncio
async def test_streams_past_the_callers_cap_get_429_and_past_the_servers_503(server, engine):
    base = server
    per_tenant, total = FLOOD_SETTINGS["max_event_streams_per_tenant"], FLOOD_SETTINGS["max_event_streams"]
    callers = [seeding.principal(engine, name=f"watcher {n}") for n in range(2)]
    jobs = [seeding.new_job(engine, owner_id=owner) for owner, _ in callers]

    async with httpx.AsyncClient(base_url=base, limits=UNBOUNDED, timeout=30) as http:

        async def open_stream(caller: int) -> httpx.Response:
            request = http.build_request("GET", f"/v1/jobs/{jobs[caller]}/events", headers={**callers[caller][1], **SSE})
            return await http.send(request, stream=True)

        first = [await open_stream(0) for _ in range(per_tenant)]
        assert {response.status_code for response in first} == {200}
        refused = await open_stream(0)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
        assert "ARTSVC_MAX_EVENT_STREAMS_PER_TENANT" in (await refused.aread()).decode()
        second = [await open_stream(1) for _ in range(total - per_tenant)]
        assert {response.status_code for response in second} == {200}
        refused = await open_stream(1)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert "ARTSVC_MAX_EVENT_STREAMS" in (await refused.aread()).decode()

        await first[0].aclose()  # a closed stream frees its slot
        for _ in range(50):
            again = await open_stream(1)
            if again.status_code == 200:
                break
            await again.aclose()
            await asyncio.sleep(0.1)
        assert again.status_code == 200
        for response in [*first[1:], *second, again]:
            await response.aclose()


async def slow_posts(http: httpx.AsyncClient, headers: dict[str, str], count: int, release: asyncio.Event) -> list:
    """``count`` job submissions whose bodies wait for ``release``: each holds a request slot until then."""

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"environment": '
        await release.wait()
        yield b'"math"}'

    posts = [asyncio.create_task(http.post("/v1/jobs", content=slow_body(), headers={**headers, **JSON}))
             for _ in range(count)]  # fmt: skip
    await asyncio.sleep(1)  # their heads are sent (a request's time, on loopback)
    return posts


async def first_refusal(http: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    """The first refused GET /v1/jobs, polling while the slow requests' heads arrive."""
    for _ in range(100):
        refused = await http.get("/v1/jobs", headers=headers)
        if refused.status_code in (429, 503):
            break
        await asyncio.sleep(0.05)
    return refused


@sqlite_only
@pytest.mark.asyncio
async def test_requests_past_the_cap_get_503_at_once_while_healthz_answers(server, engine):
    """Requests whose bodies are still arriving, from two callers, fill the cap; the next gets 503 with Retry-After,
    /healthz 200."""
    base = server
    callers = [seeding.principal(engine, name=f"caller {n}")[1] for n in range(3)]
    share = FLOOD_SETTINGS["max_concurrent_requests_per_caller"]
    release = asyncio.Event()
    async with httpx.AsyncClient(base_url=base, limits=UNBOUNDED, timeout=30) as http:
        slow = [*await slow_posts(http, callers[0], share, release), *await slow_posts(http, callers[1], share, release)]
        refused = await first_refusal(http, callers[2])
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "ARTSVC_MAX_CONCURRENT_REQUESTS" in refused.json()["detail"]
        assert (await http.get("/healthz")).status_code == 200
        release.set()
        done = await asyncio.gather(*slow)
        assert [response.status_code for response in done] == [201] * len(slow), done[0].text
        assert (await http.get("/v1/jobs", headers=callers[2])).status_code == 200


@sqlite_only
@pytest.mark.asyncio
async def test_one_caller_past_its_share_gets_429_while_another_is_served(server, engine):
    base = server
    (_, flooder), (_, other) = seeding.principal(engine, name="flooder"), seeding.principal(engine, name="other")
    release = asyncio.Event()
    async with httpx.AsyncClient(base_url=base, limits=UNBOUNDED, timeout=30) as http:
        slow = await slow_posts(http, flooder, FLOOD_SETTINGS["max_concurrent_requests_per_caller"], release)
        refused = await first_refusal(http, flooder)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "ARTSVC_MAX_CONCURRENT_REQUESTS_PER_CALLER" in refused.json()["detail"]
        assert (await http.get("/v1/jobs", headers=other)).status_code == 200  # the rest of the cap is the others'
        release.set()
        assert {response.status_code for response in await asyncio.gather(*slow)} == {201}
        assert (await http.get("/v1/jobs", headers=flooder)).status_code == 200


def test_a_job_is_read_while_every_pooled_connection_is_taken(database_url, engine, tmp_path):
    """Keyed reads (the token, a job by id, a page of jobs) run on the event loop's own connection: an operator
    still reads a job while slow requests hold the whole pool."""
    settings = Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data", **FLOOD_SETTINGS)
    app = create_app(settings)
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    held = [app.state.engine.connect() for _ in range(settings.db_pool_size + settings.db_max_overflow)]
    try:
        with TestClient(app) as client:
            one, page = client.get(f"/v1/jobs/{job_id}", headers=headers), client.get("/v1/jobs", headers=headers)
    finally:
        for connection in held:
            connection.close()
        app.state.engine.dispose()
    assert one.status_code == 200 and one.json()["id"] == job_id
    assert page.status_code == 200 and [job["id"] for job in page.json()["data"]] == [job_id]


def test_no_free_connection_within_the_pools_wait_is_a_503(database_url, engine, tmp_path):
    """Every pooled connection taken (here by the test): a request answers 503 after db_pool_timeout_s, not 500.
    (The token is read on the event loop's own connection; listing evaluations needs one from the pool.)"""
    settings = Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data", **FLOOD_SETTINGS)
    app = create_app(settings)
    _, headers = seeding.principal(engine)
    held = [app.state.engine.connect() for _ in range(settings.db_pool_size + settings.db_max_overflow)]
    try:
        with TestClient(app) as client:
            response = client.get("/v1/evaluations", headers=headers)
    finally:
        for connection in held:
            connection.close()
        app.state.engine.dispose()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "ARTSVC_DB_POOL_SIZE" in response.json()["detail"]
