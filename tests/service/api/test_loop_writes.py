"""A submission's write on the event loop (service/api/loop_writes.py): on SQLite it is done right there when the write
lock is free; when a worker (or anything else) holds SQLite's write lock, the submission waits for it on a request
thread while the loop goes on answering, and it is written once, when the lock comes free."""

from __future__ import annotations

import sqlite3
import threading
import time

import httpx
import pytest
from sqlmodel import Session, func, select

from service import submission
from service.store import db as store_db
from service.store.tables import Job, Role

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def threaded_writes(monkeypatch) -> list[str]:
    """The ids of the jobs whose write went to a request thread (``queue_in_turn``), which still runs."""
    on_threads: list[str] = []
    queue_in_turn = submission.queue_in_turn

    def recorded(session, job, **kwargs):  # noqa: ANN001, ANN003, ANN202
        on_threads.append(job.id)
        return queue_in_turn(session, job, **kwargs)

    monkeypatch.setattr(submission, "queue_in_turn", recorded)
    return on_threads


def test_a_submission_is_written_on_the_loop_on_sqlite_and_on_a_thread_on_postgresql(client, auth, engine, threaded_writes):
    headers = auth(Role.client)
    made = [client.post("/v1/jobs", json={"environment": "math"}, headers=headers) for _ in range(3)]
    assert [response.status_code for response in made] == [201] * 3
    if engine.dialect.name == "sqlite":
        assert threaded_writes == []
    else:  # its writes wait on row locks and round trips: never on the loop
        assert threaded_writes == [response.json()["id"] for response in made]
    replay = {**headers, "Idempotency-Key": "k"}
    first = client.post("/v1/jobs", json={"environment": "math"}, headers=replay)
    again = client.post("/v1/jobs", json={"environment": "math"}, headers=replay)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 4


@sqlite_only
def test_while_another_connection_holds_the_write_lock_a_submission_waits_on_a_thread_and_the_loop_answers(
    live_server, auth, engine, threaded_writes
):
    headers = auth(Role.client)
    queued = httpx.post(f"{live_server}/v1/jobs", json={"environment": "math"}, headers=headers, timeout=10)
    assert queued.status_code == 201 and threaded_writes == []
    worker = sqlite3.connect(engine.url.database, isolation_level=None)  # as a worker writing a step
    worker.execute("BEGIN IMMEDIATE")
    answers: list[httpx.Response] = []
    submitting = threading.Thread(
        target=lambda: answers.append(httpx.post(f"{live_server}/v1/jobs", json={"environment": "math"}, headers=headers, timeout=30))
    )
    try:
        submitting.start()
        time.sleep(0.2)
        for _ in range(5):  # the loop is not waiting for the lock: reads are answered meanwhile, at once
            assert httpx.get(f"{live_server}/v1/jobs/{queued.json()['id']}", headers=headers, timeout=1).status_code == 200
        assert answers == [] and submitting.is_alive() and len(threaded_writes) == 1
    finally:
        worker.execute("COMMIT")
        worker.close()
    submitting.join(30)
    assert [response.status_code for response in answers] == [201]
    assert threaded_writes == [answers[0].json()["id"]]
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 2


@sqlite_only
def test_the_loop_does_not_take_a_turn_another_thread_holds(app, engine):
    loop_writes = app.state.loop_writes
    ran: list[str] = []
    with store_db.one_writer(engine):
        assert loop_writes.try_now(lambda session: ran.append("loop")) is None
    assert loop_writes.try_now(lambda session: ran.append("loop") or "done") == "done"
    assert ran == ["loop"]
