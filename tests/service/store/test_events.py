"""A job's event stream is in commit order: a reader resuming from its cursor never skips an event that a slower
writer committed after a faster one (PostgreSQL hands out ids at insert, not at commit)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text
from sqlmodel import Session

from service.spec import JobSpec
from service.store import runs
from service.store.events import append_event, events_after


def _blocked_on_a_lock(engine) -> bool:
    with engine.connect() as connection:
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return connection.execute(text(waiting)).scalar_one() > 0


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite has one writer at a time anyway
def test_a_reader_following_its_cursor_sees_an_event_committed_after_a_later_one(engine):
    with Session(engine) as session:
        job_id = runs.create_job(session, spec=JobSpec(environment="math")).id
        session.commit()
        cursor = max(e.id for e in events_after(session, job_id=job_id))
    seen: list[str] = []

    def read() -> None:
        nonlocal cursor
        with Session(engine) as session:
            for event in events_after(session, job_id=job_id, after_id=cursor):
                seen.append(event.kind)
                cursor = event.id

    slow = Session(engine)
    append_event(slow, job_id=job_id, kind="slow")
    slow.flush()  # its id is assigned now; the transaction stays open

    def fast_writer() -> None:
        with Session(engine) as fast:
            append_event(fast, job_id=job_id, kind="fast")
            fast.commit()

    writer = threading.Thread(target=fast_writer)
    writer.start()
    deadline = time.monotonic() + 10
    while writer.is_alive() and not _blocked_on_a_lock(engine) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the fast writer committed (unordered) or waits for the slow one (ordered)
    read()
    slow.commit()
    slow.close()
    writer.join(timeout=10)
    assert not writer.is_alive()
    read()
    assert sorted(seen) == ["fast", "slow"]  # neither skipped
    assert seen == ["slow", "fast"]  # and the stream's order is the commit order
