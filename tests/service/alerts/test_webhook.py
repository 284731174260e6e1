"""WebhookNotifier against a real HTTP server on loopback: retries, Retry-After, final failures, shutdown."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.alerts import WebhookNotifier
from service.alerts.record import alert_data
from service.alerts.webhook import _retry_after
from service.spec import JobSpec
from service.store import runs
from service.store.tables import Alert

Answer = tuple[int, dict[str, str]]


class Hook:
    """A loopback HTTP server that records each POSTed JSON body and answers the n-th with ``answer(n)``;
    with ``hold`` it keeps each request waiting until ``release`` is set."""

    def __init__(self, answer: Callable[[int], Answer], *, hold: bool = False) -> None:
        self.bodies: list[dict] = []
        self.received = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, headers = answer(len(hook.bodies))
                hook.received.set()
                hook.release.wait(timeout=30)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": "0"}.items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Hook]]:
    hooks: list[Hook] = []

    def start(answer: Callable[[int], Answer], *, hold: bool = False) -> Hook:
        hooks.append(Hook(answer, hold=hold))
        return hooks[-1]

    yield start
    for hook in hooks:
        hook.close()


@pytest.fixture
def alert(store) -> Alert:
    with Session(store, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        session.flush()  # the job row before the alert that refers to it
        row = Alert(job_id=job.id, kind="collapse", step=3, message="7 of 8 groups", evidence={"fraction": 0.875})
        session.add(row)
        session.commit()
    return row


async def deliver(notifier: WebhookNotifier, alert: Alert) -> None:
    notifier.notify([alert])
    await notifier.aclose()  # returns once the delivery is over


def outcome(engine: Engine, alert: Alert) -> tuple[str | None, int]:
    with Session(engine) as session:
        row = session.get(Alert, alert.id)
        return row.webhook_status, row.webhook_attempts


def quick(url: str | None, engine: Engine, **options) -> WebhookNotifier:
    return WebhookNotifier(url, engine, **{"backoff_s": 0.01, "max_attempts": 3, **options})


@pytest.mark.asyncio
async def test_delivered_after_a_5xx_and_a_429(serve, store, alert):
    script = {1: (500, {}), 2: (429, {"Retry-After": "0"})}
    hook = serve(lambda n: script.get(n, (200, {})))
    await deliver(quick(hook.url, store, max_attempts=5), alert)
    assert outcome(store, alert) == ("delivered", 3)
    assert hook.bodies == [alert_data(alert)] * 3
    assert hook.bodies[0]["kind"] == "collapse" and hook.bodies[0]["evidence"] == {"fraction": 0.875}


@pytest.mark.timeout(60)  # an uncapped wait would hang here
@pytest.mark.asyncio
async def test_a_long_retry_after_is_capped(serve, store, alert):
    hook = serve(lambda n: (429, {"Retry-After": "3600"}) if n == 1 else (200, {}))
    await deliver(quick(hook.url, store, max_retry_after_s=0.01), alert)
    assert outcome(store, alert) == ("delivered", 2)


@pytest.mark.parametrize(
    ("header", "wait"), [("2", 2.0), ("0", 0.0), ("3600", 30.0), ("-1", 0.5), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.5)]
)
def test_retry_after_is_honoured_up_to_its_cap(header, wait):
    assert _retry_after(httpx.Response(429, headers={"Retry-After": header}), default=0.5, cap=30.0) == wait


@pytest.mark.asyncio
async def test_failed_after_max_attempts_when_the_server_keeps_failing(serve, store, alert):
    hook = serve(lambda n: (503, {}))
    await deliver(quick(hook.url, store), alert)
    assert outcome(store, alert) == ("failed", 3) and len(hook.bodies) == 3


@pytest.mark.asyncio
async def test_a_client_error_is_final(serve, store, alert):
    hook = serve(lambda n: (400, {}))
    await deliver(quick(hook.url, store), alert)
    assert outcome(store, alert) == ("failed", 1) and len(hook.bodies) == 1


@pytest.mark.asyncio
async def test_failed_when_nothing_listens(store, alert):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once the probe closes: connections are refused
    await deliver(quick(f"http://127.0.0.1:{port}/alerts", store), alert)
    assert outcome(store, alert) == ("failed", 3)


@pytest.mark.asyncio
async def test_aclose_gives_up_on_a_stuck_delivery_after_its_bound(serve, store, alert):
    hook = serve(lambda n: (200, {}), hold=True)
    notifier = quick(hook.url, store, close_timeout_s=0.1)
    notifier.notify([alert])
    assert await asyncio.to_thread(hook.received.wait, 30)  # the request is in, and held
    await notifier.aclose()
    assert outcome(store, alert) == ("pending", 0)  # not delivered, and says so


def test_notify_without_a_url_or_a_loop_does_nothing_and_never_raises(serve, store, alert):
    hook = serve(lambda n: (200, {}))
    WebhookNotifier(None, store).notify([alert])
    WebhookNotifier(hook.url, store).notify([alert])  # no running loop: logged, not raised
    assert outcome(store, alert) == (None, 0) and hook.bodies == []
