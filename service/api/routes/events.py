"""A job's event log: a page of JSON, or with ``Accept: text/event-stream`` a live stream that ends with the job.

The stream polls the store with a short session of its own each time (no connection is held between
polls), sends each event with its id (what ``Last-Event-ID`` resumes from), pings while idle, and
closes after an ``end`` event carrying the final job once the job ended and its ``finished`` event went out.
Live streams are capped: ``max_event_streams`` in all (503 beyond) and ``max_event_streams_per_tenant``
per caller (429 beyond), both with ``Retry-After``; a stream's slot is freed when it ends, however it ends.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from service.api.deps import CallerDep, SessionDep, get_engine, visible_job
from service.api.schemas import JobPublic
from service.api.watch_schemas import MAX_ID, EventList, EventPublic
from service.auth import Principal
from service.store import jobs, runs
from service.store.events import events_after

router = APIRouter(prefix="/v1", tags=["events"])
logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how soon a committed event reaches a stream
PING_SECONDS = 10  # keep-alive comments on an idle stream, well within clients' read timeouts
SEND_TIMEOUT_SECONDS = 30  # a client that reads nothing for this long is dropped
BATCH = 500  # events read per poll; a full batch is followed by the next at once
STREAM_RETRY_AFTER_S = 5  # streams last long: a slot frees more slowly than a request's

STREAM = {
    "description": "A page of events, or with `Accept: text/event-stream` a live stream: each event as "
    "`id: <event id>`, `event: <kind>`, `data: <event JSON>`, and last `event: end` with the final job.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


@router.get("/jobs/{job_id}/events", response_model=EventList, responses={200: STREAM})
def job_events(
    job_id: str,
    request: Request,
    session: SessionDep,
    caller: CallerDep,
    engine: Annotated[Engine, Depends(get_engine)],
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="Only events with a larger id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Events per page (JSON only).")] = 100,
    last_event_id: Annotated[
        int | None, Header(ge=0, le=MAX_ID, description="Resume a stream after this event (overrides `after`).")
    ] = None,
) -> EventList | EventSourceResponse:
    """Lifecycle, step, validation and alert events, oldest first; live with `Accept: text/event-stream`."""
    job = visible_job(session, caller=caller, job_id=job_id, kind=None)  # an evaluation's too
    if "text/event-stream" in request.headers.get("accept", ""):
        session.close()  # the stream reads with short sessions of its own: hold no connection meanwhile
        slots: StreamSlots = request.app.state.stream_slots
        slots.take(caller)
        start = last_event_id if last_event_id is not None else after
        stream = event_stream(engine, job_id=job.id, after_id=start)
        return SlotStream(stream, release=lambda: slots.give_back(caller))
    rows = events_after(session, job_id=job.id, after_id=after, limit=limit + 1)
    page = rows[:limit]
    return EventList(
        data=[EventPublic.model_validate(row) for row in page], next_cursor=page[-1].id if len(rows) > limit else None
    )


async def event_stream(engine: Engine, *, job_id: str, after_id: int) -> AsyncIterator[ServerSentEvent]:
    """Every event of the job after ``after_id`` as it is committed, then ``end`` with the final job.

    A store that fails mid-stream closes the stream (the client reconnects from its last event id); no free
    connection (a busy server) only skips a poll.
    """
    while True:
        try:
            events, final = await run_in_threadpool(poll, engine, job_id=job_id, after_id=after_id)
        except PoolTimeout:  # the server is busy: this poll is skipped, the stream goes on
            events, final = [], None
        except SQLAlchemyError as exc:
            logger.warning("event stream of job %s lost the store: %s", job_id, exc)
            return
        for event in events:
            yield event
        if events:
            after_id = int(events[-1].id)
        if final is not None:
            yield ServerSentEvent(event="end", data=final)
            return
        if len(events) < BATCH:
            await anyio.sleep(POLL_SECONDS)


def poll(engine: Engine, *, job_id: str, after_id: int) -> tuple[list[ServerSentEvent], str | None]:
    """The next events after ``after_id``, and the final job's JSON if these reach the end of its log.

    The job is read before the events: a job seen ended had its ``finished`` event committed with it,
    so the events read next include it.
    """
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)  # jobs are never deleted
        final = JobPublic.model_validate(job).model_dump_json() if job.status in jobs.ENDED else None
        rows = events_after(session, job_id=job_id, after_id=after_id, limit=BATCH)
        events = [
            ServerSentEvent(id=str(row.id), event=row.kind, data=EventPublic.model_validate(row).model_dump_json())
            for row in rows
        ]
    return events, (final if len(rows) < BATCH else None)


class StreamSlots:
    """Live streams in all and per caller, counted from the route (a worker thread) to the stream's end."""

    def __init__(self, *, max_streams: int, max_per_caller: int) -> None:
        self.max_streams, self.max_per_caller = max_streams, max_per_caller
        self.per_caller: Counter[str] = Counter()
        self.lock = threading.Lock()

    def take(self, caller: Principal) -> None:
        """Count a new stream of ``caller``, or refuse it: 503 past the server's limit, 429 past the caller's."""
        with self.lock:
            if (refusal := self._refusal(caller)) is not None:
                raise refusal
            self.per_caller[caller.id] += 1

    def try_take(self, caller: Principal) -> bool:
        """``take``, answering False where it would refuse."""
        with self.lock:
            if self._refusal(caller) is not None:
                return False
            self.per_caller[caller.id] += 1
            return True

    def _refusal(self, caller: Principal) -> HTTPException | None:
        retry = {"Retry-After": str(STREAM_RETRY_AFTER_S)}
        if self.per_caller.total() >= self.max_streams:
            detail = (
                f"the server is at its limit of {self.max_streams} live event streams (ARTSVC_MAX_EVENT_STREAMS); "
                "retry later, or read the events as JSON pages"
            )
            return HTTPException(503, detail, retry)
        if self.per_caller[caller.id] >= self.max_per_caller:
            detail = (
                f"this token has {self.max_per_caller} live event streams open, the limit per caller "
                "(ARTSVC_MAX_EVENT_STREAMS_PER_TENANT); close one first"
            )
            return HTTPException(429, detail, retry)
        return None

    def give_back(self, caller: Principal) -> None:
        with self.lock:
            self.per_caller[caller.id] -= 1
            if self.per_caller[caller.id] <= 0:
                del self.per_caller[caller.id]


class FreesItsSlot:
    """Mixed into a streamed response: ``release`` runs when it ends, sent in full, dropped by the client, or
    cancelled."""

    release: Callable[[], None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)  # type: ignore[misc]
        finally:
            self.release()


class SlotStream(FreesItsSlot, EventSourceResponse):
    """An event stream that frees its slot when it ends."""

    def __init__(self, content: AsyncIterator[ServerSentEvent], *, release: Callable[[], None]) -> None:
        super().__init__(content, ping=PING_SECONDS, send_timeout=SEND_TIMEOUT_SECONDS)
        self.release = release
