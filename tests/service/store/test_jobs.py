"""The jobs data functions on SQLite and PostgreSQL: keyset pages through equal timestamps, cursors, cancel."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from sqlmodel import Session

from service.api.schemas import JobPublic
from service.spec import JobSpec
from service.store import jobs, runs
from service.store.tables import JobStatus, StopReason

SAME_MOMENT = datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def make_jobs(session: Session, count: int, *, owner_id: str = "owner", created_at: datetime | None = None) -> list:
    made = []
    for seed in range(count):
        job = runs.create_job(session, spec=JobSpec(environment="math", seed=seed), owner_id=owner_id)
        if created_at is not None:
            job.created_at = created_at
        made.append(job.id)
    session.commit()
    return made


def all_pages(session: Session, *, limit: int, **filters) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        filters = {"owner_id": None, "status": None} | filters
        page, cursor = jobs.list_jobs(session.connection(), limit=limit, cursor=cursor, **filters)
        pages.append([job.id for job in page])
        if cursor is None:
            return pages


def test_pages_walk_jobs_with_equal_timestamps_once_each(engine):
    with Session(engine) as session:
        tied = make_jobs(session, 5, created_at=SAME_MOMENT)
        newer = make_jobs(session, 2)
        pages = all_pages(session, limit=2)
    assert [len(page) for page in pages] == [2, 2, 2, 1]
    walked = [job_id for page in pages for job_id in page]
    assert walked == newer[::-1] + sorted(tied, reverse=True)  # newest first; ties by id, descending


def test_owner_and_status_filters_apply_to_every_page(engine):
    with Session(engine) as session:
        mine = make_jobs(session, 3, owner_id="me")
        make_jobs(session, 2, owner_id="someone else")
        runs.finish_job(
            session, job=runs.get_job(session, job_id=mine[0]), status=JobStatus.failed, stop_reason=StopReason.error,
            best_step=None, best_val_accuracy=None, step0_val_accuracy=None, error="boom",
        )  # fmt: skip
        session.commit()
        assert all_pages(session, limit=1, owner_id="me") == [[mine[2]], [mine[1]], [mine[0]]]
        assert all_pages(session, limit=5, owner_id="me", status=JobStatus.queued) == [[mine[2], mine[1]]]
        assert all_pages(session, limit=5, status=JobStatus.failed) == [[mine[0]]]


def test_a_cursor_round_trips_and_anything_else_is_refused(engine):
    with Session(engine) as session:
        job = runs.get_job(session, job_id=make_jobs(session, 1, created_at=SAME_MOMENT)[0])
        assert jobs.decode_cursor(jobs.encode_cursor(job)) == (SAME_MOMENT, job.id)
    for bad in ["", "=", "a", "not base64!", jobs.encode_cursor(job)[:-3]]:
        with pytest.raises(jobs.BadCursor, match="malformed cursor"):
            jobs.decode_cursor(bad)


def test_the_same_idempotency_key_with_another_spec_is_a_conflict(engine):
    digest = jobs.request_hash(JobSpec(environment="math"))
    other = jobs.request_hash(JobSpec(environment="math", seed=1))
    with Session(engine) as session:
        job = runs.create_job(
            session, spec=JobSpec(environment="math"), owner_id="me", idempotency_key="k", request_hash=digest
        )
        session.commit()
        assert jobs.earlier_submission(session, owner_id="me", idempotency_key="k", request_hash=digest).id == job.id
        assert jobs.earlier_submission(session, owner_id="you", idempotency_key="k", request_hash=other) is None
        with pytest.raises(jobs.IdempotencyConflict):
            jobs.earlier_submission(session, owner_id="me", idempotency_key="k", request_hash=other)


def test_cancel_ends_a_queued_job_flags_a_running_one_and_refuses_an_ended_one(engine):
    with Session(engine, expire_on_commit=False) as session:
        queued, running = (runs.get_job(session, job_id=job_id) for job_id in make_jobs(session, 2))
        runs.mark_running(session, job=running)
        session.commit()
        jobs.request_cancel(session, job=queued, requested_by="me")
        jobs.request_cancel(session, job=running, requested_by="me")
        session.commit()
        assert (queued.status, queued.stop_reason) == (JobStatus.cancelled, StopReason.cancelled)
        assert queued.finished_at is not None
        assert (running.status, running.cancel_requested, running.stop_reason) == (JobStatus.running, True, None)
        with pytest.raises(jobs.JobEnded, match="already ended"):
            jobs.request_cancel(session, job=queued, requested_by="me")


def test_a_jobs_core_row_shows_what_its_orm_object_shows(engine):
    """``GET /v1/jobs/{id}`` reads a Core row, other routes the ORM object: both must give the same public job, enums,
    time zones and JSON included, on both databases."""
    with Session(engine, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math", seed=3), owner_id="owner")
        job.started_at = SAME_MOMENT
        job.step = 7
        runs.finish_job(session, job=job, status=JobStatus.failed, stop_reason=StopReason.plateau, best_step=4,
                        best_val_accuracy=0.5, step0_val_accuracy=0.125, error="boom")  # fmt: skip
        session.commit()
    with Session(engine) as session:
        shown = JobPublic.model_validate(runs.get_job(session, job_id=job.id)).model_dump(mode="json")
    with engine.connect() as connection:
        row = runs.job_row(connection, job_id=job.id)
        assert runs.job_row(connection, job_id=str(uuid.uuid4())) is None
    assert JobPublic.model_validate(row).model_dump(mode="json") == shown
    assert (row.owner_id, row.kind, shown["status"], shown["started_at"]) == ("owner", "training", "failed", "2020-01-02T03:04:05.678901Z")
