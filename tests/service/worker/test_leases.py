"""Job leases on SQLite and PostgreSQL: claim order, one winner per job, takeover, renewal, release."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlmodel import Session

from service.store import runs
from service.store.events import events_after
from service.store.tables import Job, JobStatus, WorkerRecord
from service.worker import leases
from tests.service.worker.conftest import load_job, submit


def _submit(engine, count: int = 1) -> list[str]:
    return [submit(engine, {"environment": "math"}) for _ in range(count)]  # one transaction each, in order


def _claim(engine, worker_id: str, lease_seconds: float = 60) -> Job | None:
    with Session(engine, expire_on_commit=False) as session:
        job = leases.claim_next(session, worker_id=worker_id, lease_seconds=lease_seconds)
        session.commit()
        return job


def _renew(engine, job_id: str, worker_id: str) -> bool:
    with Session(engine) as session:
        renewed = leases.renew(session, job_id=job_id, worker_id=worker_id, lease_seconds=60)
        session.commit()
        return renewed


def _expire_lease(engine, job_id: str) -> None:
    """What the clock does to the lease of a worker that died."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        job.lease_expires_at = leases.database_now(session) - timedelta(seconds=1)
        session.add(job)
        session.commit()


def test_jobs_are_claimed_oldest_first_with_a_lease_and_an_attempt(engine):
    first, second = _submit(engine, 2)
    claimed = _claim(engine, "w1", lease_seconds=30)
    assert claimed.id == first
    assert claimed.status is JobStatus.running and claimed.worker_id == "w1" and claimed.attempts == 1
    with Session(engine) as session:
        remaining = claimed.lease_expires_at - leases.database_now(session)
    assert timedelta(seconds=25) < remaining <= timedelta(seconds=30)
    assert _claim(engine, "w2").id == second
    assert _claim(engine, "w3") is None  # both are held under live leases


def test_each_job_is_claimed_exactly_once_by_concurrent_claimers(engine):
    job_ids = _submit(engine, 12)
    claimers = 6
    start = threading.Barrier(claimers)
    claims: dict[str, list[str]] = {f"w{i}": [] for i in range(claimers)}
    errors: list[BaseException] = []

    def claim_until_empty(worker_id: str) -> None:
        try:
            start.wait()
            while (job := _claim(engine, worker_id)) is not None:
                claims[worker_id].append(job.id)
        except BaseException as exc:  # surfaced below: a thread's exception would otherwise vanish
            errors.append(exc)

    threads = [threading.Thread(target=claim_until_empty, args=(w,)) for w in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    won = [job_id for ids in claims.values() for job_id in ids]
    assert sorted(won) == sorted(job_ids)  # every job once: no double claim, none lost
    for worker_id, ids in claims.items():
        for job_id in ids:
            job = load_job(engine, job_id)
            assert job.worker_id == worker_id and job.attempts == 1


def test_a_job_whose_lease_expired_is_taken_over_and_the_old_holder_cannot_renew(engine):
    (job_id,) = _submit(engine)
    assert _claim(engine, "dead").id == job_id
    assert _claim(engine, "other") is None
    assert _renew(engine, job_id, "dead")  # a live holder renews

    _expire_lease(engine, job_id)
    taken = _claim(engine, "other")
    assert taken.id == job_id and taken.worker_id == "other" and taken.attempts == 2
    assert not _renew(engine, job_id, "dead")
    assert _renew(engine, job_id, "other")


def test_a_running_job_without_a_lease_is_never_claimed(engine):
    """`artsvc train` runs a job in its own process without a lease: no worker may take it."""
    (job_id,) = _submit(engine)
    with Session(engine) as session:
        runs.mark_running(session, job=runs.get_job(session, job_id=job_id))
        session.commit()
    assert _claim(engine, "w1") is None


def test_release_puts_the_job_back_in_the_queue_for_the_next_worker(engine):
    (job_id,) = _submit(engine)
    _claim(engine, "w1")
    with Session(engine) as session:
        assert not leases.release(session, job_id=job_id, worker_id="w2")  # not its lease
        assert leases.release(session, job_id=job_id, worker_id="w1")
        session.commit()
    job = load_job(engine, job_id)
    assert job.status is JobStatus.queued and job.worker_id is None and job.lease_expires_at is None
    with Session(engine) as session:
        assert events_after(session, job_id=job_id)[-1].data["released_by"] == "w1"
    assert not _renew(engine, job_id, "w1")
    resumed = _claim(engine, "w2")
    assert resumed.id == job_id and resumed.attempts == 2


def test_an_ended_job_is_neither_claimed_nor_renewed(engine):
    (job_id,) = _submit(engine)
    _claim(engine, "w1")
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        job.status = JobStatus.succeeded
        session.add(job)
        session.commit()
    _expire_lease(engine, job_id)
    assert not _renew(engine, job_id, "w1")
    assert _claim(engine, "w2") is None


def test_worker_records_show_start_heartbeat_and_stop(engine):
    with Session(engine) as session:
        leases.register_worker(session, worker_id="w1", hostname="host", pid=42, concurrency=2)
        session.commit()
    with Session(engine) as session:
        leases.heartbeat_worker(session, worker_id="w1", running_jobs=2)
        session.commit()
    with Session(engine) as session:
        record = session.get(WorkerRecord, "w1")
        assert record.running_jobs == 2 and record.stopped_at is None
        assert record.heartbeat_at >= record.started_at
        leases.stop_worker(session, worker_id="w1")
        session.commit()
        session.refresh(record)
        assert record.stopped_at is not None and record.running_jobs == 0
        with pytest.raises(LookupError):
            leases.heartbeat_worker(session, worker_id="nobody", running_jobs=0)
