"""A job's event log: a page of JSON, or with ``Accept: text/event-stream`` a live stream that ends with the job.

The stream polls the store with a short session of its own each time (no connection is held between
polls), sends each event with its id (what ``Last-Event-ID`` resumes from), pings while idle, and
closes after an ``end`` event carrying the final job once the job ended and its ``finished`` event went out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from service.api.deps import CallerDep, SessionDep, get_engine, visible_job
from service.api.schemas import JobPublic
from service.api.watch_schemas import MAX_ID, EventList, EventPublic
from service.store import jobs, runs
from service.store.events import events_after

router = APIRouter(prefix="/v1", tags=["events"])
logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how soon a committed event reaches a stream
PING_SECONDS = 10  # keep-alive comments on an idle stream, well within clients' read timeouts
SEND_TIMEOUT_SECONDS = 30  # a client that reads nothing for this long is dropped
BATCH = 500  # events read per poll; a full batch is followed by the next at once

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
        start = last_event_id if last_event_id is not None else after
        stream = event_stream(engine, job_id=job.id, after_id=start)
        return EventSourceResponse(stream, ping=PING_SECONDS, send_timeout=SEND_TIMEOUT_SECONDS)
    rows = events_after(session, job_id=job.id, after_id=after, limit=limit + 1)
    page = rows[:limit]
    return EventList(
        data=[EventPublic.model_validate(row) for row in page], next_cursor=page[-1].id if len(rows) > limit else None
    )


async def event_stream(engine: Engine, *, job_id: str, after_id: int) -> AsyncIterator[ServerSentEvent]:
    """Every event of the job after ``after_id`` as it is committed, then ``end`` with the final job.

    A store that fails mid-stream closes the stream (the client reconnects from its last event id).
    """
    while True:
        try:
            events, final = await run_in_threadpool(poll, engine, job_id=job_id, after_id=after_id)
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
