"""A job's events on SQLite and PostgreSQL: pages of JSON, and a live server-sent-event stream read by a real
HTTP client from uvicorn on loopback while another thread commits the rows, ending when the job ends."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlalchemy.engine import make_url
from sqlmodel import create_engine

from service.app import create_app
from service.api.routes import events as events_route
from service.sse import EventStreamParser, ServerSentEvent
from service.store.tables import Role
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.conftest import serve

EVENT_FIELDS = {"id", "job_id", "kind", "step", "data", "created_at"}
SSE = {"Accept": "text/event-stream"}


def stream(http: httpx.Client, url: str, headers: dict[str, str]) -> Iterator[ServerSentEvent]:
    """The events of a live stream, parsed as ``artsvc watch`` parses them, until the server closes it."""
    with http.stream("GET", url, headers={**headers, **SSE}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        parser = EventStreamParser()
        for text in response.iter_text():
            yield from parser.feed(text)


def wait_for(check: Callable[[], bool], *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_events_page_oldest_first_with_a_cursor(client, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    seeding.record(engine, job_id, 0, accuracy=0.1)
    seeding.record(engine, job_id, 1, reward=0.3)
    seeding.record(engine, job_id, 2, reward=0.4, accuracy=0.2)
    url = f"/v1/jobs/{job_id}/events"

    everything = client.get(url, headers=headers).json()
    kinds = [event["kind"] for event in everything["data"]]
    assert kinds == ["queued", "started", "validation", "step", "step", "validation"]
    assert everything["next_cursor"] is None
    assert all(set(event) == EVENT_FIELDS and event["job_id"] == job_id for event in everything["data"])
    assert everything["data"][3]["step"] == 1 and everything["data"][3]["data"]["reward_mean"] == 0.3

    pages, after = [], 0
    while after is not None:
        page = client.get(url, params={"after": after, "limit": 4}, headers=headers).json()
        pages.append(page["data"])
        after = page["next_cursor"]
    assert [len(page) for page in pages] == [4, 2]
    assert [event for page in pages for event in page] == everything["data"]


@sqlite_only
def test_events_are_for_the_owner_and_operators_only(client, engine):
    owner, headers = seeding.principal(engine, name="alice")
    _, other = seeding.principal(engine, name="bob")
    _, operator = seeding.principal(engine, Role.operator)
    url = f"/v1/jobs/{seeding.new_job(engine, owner_id=owner)}/events"
    assert client.get(url).status_code == 401
    assert client.get(url, headers={**SSE}).status_code == 401
    assert client.get(url, headers=other).status_code == 404
    assert client.get(url, headers={**other, **SSE}).status_code == 404
    assert [event["kind"] for event in client.get(url, headers=operator).json()["data"]] == ["queued"]
    assert client.get("/v1/jobs/not-a-job/events", headers=operator).status_code == 404
    assert client.get(url, params={"after": -1}, headers=headers).status_code == 422
    assert client.get(url, headers={**headers, **SSE, "Last-Event-ID": "seven"}).status_code == 422


def test_the_stream_delivers_events_as_they_are_committed_and_ends_with_the_job(live_server, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    writes = [
        lambda: seeding.start(engine, job_id),
        lambda: seeding.record(engine, job_id, 1, reward=0.2),
        lambda: seeding.record(engine, job_id, 2, reward=0.4, accuracy=0.5),
        lambda: seeding.finish(engine, job_id),
    ]
    triggers = ["queued", "started", "step", "validation"]  # the event before the first write, then each write's last
    go: queue.Queue[bool] = queue.Queue()

    def writer() -> None:  # commits the next rows only once the reader has seen the previous ones
        for write in writes:
            if not go.get():
                return
            write()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    received = []
    try:
        with httpx.Client(base_url=live_server, timeout=30) as http:
            for event in stream(http, f"/v1/jobs/{job_id}/events", headers):
                received.append(event)
                if triggers and event.event == triggers[0]:
                    triggers.pop(0)
                    go.put(True)  # the stream is open and has caught up: commit the next rows now
            final = http.get(f"/v1/jobs/{job_id}", headers=headers).json()
    finally:
        go.put(False)
        thread.join()

    assert [event.event for event in received] == ["queued", "started", "step", "step", "validation", "finished", "end"]
    ids = [int(event.id) for event in received[:-1]]
    assert ids == sorted(set(ids))
    assert received[-1].id == received[-2].id  # `end` carries no id: a resume starts after `finished`
    assert json.loads(received[-1].data) == final
    assert final["status"] == "succeeded"


def test_a_stream_resumes_after_last_event_id_or_after(live_server, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    seeding.record(engine, job_id, 1)
    seeding.record(engine, job_id, 2)
    seeding.finish(engine, job_id)
    url = f"/v1/jobs/{job_id}/events"
    with httpx.Client(base_url=live_server, timeout=30) as http:
        history = [event for event in stream(http, url, headers)]
        assert [event.event for event in history] == ["queued", "started", "step", "step", "finished", "end"]
        resumed = list(stream(http, url, {**headers, "Last-Event-ID": history[2].id}))
        assert [(event.event, event.id) for event in resumed] == [(event.event, event.id) for event in history[3:]]
        from_query = list(stream(http, f"{url}?after={history[3].id}", headers))
        assert [event.event for event in from_query] == ["finished", "end"]
        header_wins = list(stream(http, f"{url}?after=0", {**headers, "Last-Event-ID": history[4].id}))
        assert [event.event for event in header_wins] == ["end"]


def test_open_streams_hold_no_database_connection_between_polls(settings, engine, database_url):
    """With a pool of one connection, several idle streams and plain requests all still get served."""
    sqlite = make_url(database_url).get_backend_name() == "sqlite"
    options = {"connect_args": {"check_same_thread": False}} if sqlite else {}
    small = create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=10, **options)
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    url = f"/v1/jobs/{job_id}/events"
    app = create_app(settings, engine=small)
    with serve(app) as (base_url, _), httpx.Client(base_url=base_url, timeout=30) as http:
        streams = [stream(http, url, headers) for _ in range(3)]
        assert [next(events).event for events in streams] == ["queued"] * 3
        assert http.get(f"/v1/jobs/{job_id}", headers=headers).json()["status"] == "queued"
        seeding.start(engine, job_id)
        assert [next(events).event for events in streams] == ["started"] * 3
        for events in streams:
            events.close()
    small.dispose()


@sqlite_only
def test_an_idle_stream_is_pinged_and_ends_when_the_client_goes(settings, engine, monkeypatch):
    monkeypatch.setattr(events_route, "PING_SECONDS", 0.2)
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    with serve(create_app(settings, engine=engine)) as (base_url, server):
        with httpx.Client(base_url=base_url, timeout=30) as http:
            with http.stream("GET", f"/v1/jobs/{job_id}/events", headers={**headers, **SSE}) as response:
                seen, lines = [], response.iter_lines()
                for line in lines:
                    seen.append(line)
                    if line.startswith(":") and "event: queued" in seen:
                        break  # nothing happened since the queued event: the server keeps the connection alive
                assert "event: queued" in seen and "ping" in seen[-1]
                assert any(line.startswith(":") for line in lines)  # still open: pinged again
        wait_for(lambda: not server.server_state.tasks, what="the stream's request to end after the client left")


@pytest.mark.parametrize("limit", [0, 1001])
@sqlite_only
def test_a_page_size_out_of_range_is_refused(client, engine, limit):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    response = client.get(f"/v1/jobs/{job_id}/events", params={"limit": limit}, headers=headers)
    assert response.status_code == 422 and "limit" in response.json()["detail"]
