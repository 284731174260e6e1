"""The event-stream parser reads what the HTML standard allows, however the bytes are chunked."""

from __future__ import annotations

import pytest

from service.sse import EventStreamParser, ServerSentEvent

STREAM = (
    ": ping\r\n"
    "\r\n"
    "id: 1\r\n"
    "event: step\r\n"
    'data: {"step": 1,\r\n'
    'data:  "reward_mean": 0.5}\r\n'
    "\r\n"
    "retry: 2500\n"
    "id:2\n"
    "data\n"
    "\n"
    "event: alert\r"
    "data: no id field: keeps the last id\r"
    "unknown: ignored\r"
    "\r"
    "id: 3\n"
    "\n"
    "event: end\n"
    "data: cut off by a dropped connection\n"
)
EVENTS = [
    ServerSentEvent(event="step", data='{"step": 1,\n "reward_mean": 0.5}', id="1"),
    ServerSentEvent(event="message", data="", id="2"),
    ServerSentEvent(event="alert", data="no id field: keeps the last id", id="2"),
]


def parse(chunks: list[str]) -> tuple[list[ServerSentEvent], EventStreamParser]:
    parser = EventStreamParser()
    return [event for chunk in chunks for event in parser.feed(chunk)], parser


@pytest.mark.parametrize("chunk_size", [len(STREAM), 1, 2, 7])
def test_events_are_the_same_however_the_stream_is_chunked(chunk_size):
    events, parser = parse([STREAM[i : i + chunk_size] for i in range(0, len(STREAM), chunk_size)])
    assert events == EVENTS
    assert parser.last_event_id == "3"  # an id with no data moves the cursor without dispatching
    assert parser.retry_ms == 2500


def test_a_carriage_return_split_from_its_line_feed_is_one_line_end():
    events, _ = parse(["data: a\r", "\ndata: b\r", "\n\r", "\n"])
    assert events == [ServerSentEvent(event="message", data="a\nb", id=None)]


def test_the_event_type_does_not_leak_into_the_next_event():
    events, _ = parse(["event: alert\n\ndata: x\n\n"])
    assert events == [ServerSentEvent(event="message", data="x", id=None)]
