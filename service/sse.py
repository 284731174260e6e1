"""A server-sent-event parser, as the HTML standard defines the stream, for ``artsvc watch``.

Fed text in arbitrary chunks, it yields whole events only: an event cut off by a dropped
connection is never seen, so a client resuming from the last ``id`` neither loses nor repeats one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class ServerSentEvent:
    event: str
    data: str
    id: str | None  # the stream's last event id when this event was dispatched (what Last-Event-ID resumes from)


class EventStreamParser:
    """Turns ``text/event-stream`` text into events: multi-line ``data``, ``event``, ``id``, ``retry``;
    comments (``:`` lines, the server's keep-alive pings) and unknown fields are skipped."""

    def __init__(self, *, last_event_id: str | None = None) -> None:
        self.last_event_id = last_event_id  # kept across reconnections, as a browser's EventSource does
        self.retry_ms: int | None = None  # the server's reconnection delay, if it sent one
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []

    def feed(self, text: str) -> Iterator[ServerSentEvent]:
        """The events completed by ``text`` (an incomplete line or event waits for more)."""
        self._buffer += text
        while (line := self._next_line()) is not None:
            if line:
                self._field(line)
            elif self._data:
                yield ServerSentEvent(event=self._event or "message", data="\n".join(self._data), id=self.last_event_id)
                self._event, self._data = "", []
            else:  # a blank line with no data dispatches nothing, but still ends the event
                self._event = ""

    def _next_line(self) -> str | None:
        """The next complete line; lines end in CRLF, LF or CR (a CR at the buffer's end may start a CRLF)."""
        end = LINE_END.search(self._buffer)
        if end is None or (end.group() == "\r" and end.end() == len(self._buffer)):
            return None
        line, self._buffer = self._buffer[: end.start()], self._buffer[end.end() :]
        return line

    def _field(self, line: str) -> None:
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
