"""The API client's event stream survives dropped connections: it resumes from the last event it
delivered (Last-Event-ID), so none is shown twice or lost; it gives up after bounded retries.

The server here is a real HTTP server on loopback that scripts the failures the real API cannot
be made to produce on demand: a stream cut in the middle of an event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service import api_client
from service.api_client import ApiClient, ApiError

KINDS = ["queued", "started", "step", "step", "validation", "finished", "end"]


def stream_text(after: int) -> str:
    return "".join(f"id: {i}\nevent: {kind}\ndata: {{\"n\": {i}}}\n\n" for i, kind in enumerate(KINDS, 1) if i > after)


class ScriptedStream(BaseHTTPRequestHandler):
    """Serves the events after Last-Event-ID; the first ``server.cuts`` responses break off mid-event."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        last = self.headers.get("Last-Event-ID")
        self.server.seen.append(last)
        if "/missing/" in self.path:
            return self.refuse()
        text = stream_text(int(last or 0))
        cut = len(self.server.seen) <= self.server.cuts
        if cut:
            text = text[: text.index("event: validation") + 10]  # inside the validation event
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
        if not cut:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True  # a cut stream ends without its last chunk: the connection just drops

    def refuse(self) -> None:
        body = b'{"detail": "no job \'missing\'"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedStream)
    server.seen, server.cuts = [], 1
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_a_dropped_stream_resumes_after_the_last_whole_event(scripted):
    with ApiClient(base_url=url(scripted), token="t") as api:
        events = list(api.events("job"))
    assert [event.event for event in events] == KINDS
    assert [event.id for event in events] == [str(i) for i in range(1, len(KINDS) + 1)]
    assert scripted.seen == [None, "4"]  # the half-sent validation event (5) was asked for again


def test_reconnection_is_bounded(scripted, monkeypatch):
    monkeypatch.setattr(api_client, "RECONNECT_DELAYS_S", (0.0, 0.0, 0.0))
    scripted.cuts = 100
    with ApiClient(base_url=url(scripted), token="t") as api, pytest.raises(ApiError, match="gave up after 3"):
        for _ in api.events("job"):
            pass
    assert scripted.seen == [None, "4", "4", "4"]


def test_a_refusal_is_not_retried_and_carries_the_apis_detail(scripted):
    with ApiClient(base_url=url(scripted), token="t") as api, pytest.raises(ApiError) as refused:
        next(api.events("missing"))
    assert str(refused.value) == "no job 'missing' (HTTP 404)" and refused.value.status == 404
    assert scripted.seen == [None]
