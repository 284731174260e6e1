"""Job leases on SQLite and PostgreSQL: claim order and fair share across tenants, one winner per job, the running
cap, takeover, renewal, release, and the cap on attempts."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlmodel import Session, func, select

from service.auth import create_token
from service.spec import JobSpec
from service.store import jobs, runs
from service.store.events import events_after
from service.store.tables import Job, JobStatus, Role, StopReason, WorkerRecord
from service.worker import leases
from tests.service.worker.conftest import load_job, submit


def _submit(engine, count: int = 1) -> list[str]:
    return [submit(engine, {"environment": "math"}) for _ in range(count)]  # one transaction each, in order


def _claim(
    engine, worker_id: str, lease_seconds: float = 60, *, max_running: int = 2, max_attempts: int = 3
) -> Job | None:
    with Session(engine, expire_on_commit=False) as session:
        job = leases.claim_next(session, worker_id=worker_id, lease_seconds=lease_seconds,
                                max_running_per_tenant=max_running, max_attempts=max_attempts)  # fmt: skip
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
    assert resumed.id == job_id and resumed.attempts == 1  # the release gave its claim back


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


def _tenant(engine, role: Role = Role.client) -> str:
    with Session(engine) as session:
        token, _ = create_token(session, role=role, name=role.value)
        session.commit()
        return token.id


def _queue(engine, owner_id: str, count: int = 1) -> list[str]:
    """``count`` jobs of ``owner_id``, oldest first, in one transaction."""
    with Session(engine) as session:
        jobs = [runs.create_job(session, spec=JobSpec(environment="math"), owner_id=owner_id) for _ in range(count)]
        session.commit()
        return [job.id for job in jobs]


def test_a_tenant_behind_another_tenants_backlog_is_served_second_not_last(engine):
    flooder, latecomer = _tenant(engine), _tenant(engine)
    backlog = _queue(engine, flooder, 50)
    (late,) = _queue(engine, latecomer)
    claimed = [_claim(engine, f"w{i}", max_running=10).id for i in range(3)]
    assert claimed == [backlog[0], late, backlog[1]]  # the tenant running fewest first, then the oldest job


def test_a_client_at_its_running_cap_waits_while_others_and_operators_are_served(engine):
    capped, other, operator = _tenant(engine), _tenant(engine), _tenant(engine, Role.operator)
    capped_jobs = _queue(engine, capped, 3)
    assert [_claim(engine, "w1", max_running=2).id, _claim(engine, "w2", max_running=2).id] == capped_jobs[:2]
    assert _claim(engine, "w3", max_running=2) is None  # its third waits though a worker is free
    (other_job,) = _queue(engine, other)
    operator_jobs = _queue(engine, operator, 3)
    served = {_claim(engine, f"w{i}", max_running=2).id for i in range(4, 8)}
    assert served == {other_job, *operator_jobs}  # operators choose how much of their own server they use
    assert _claim(engine, "w8", max_running=2) is None

    _expire_lease(engine, capped_jobs[0])  # its worker died: the job no longer runs, and may be taken over
    assert _claim(engine, "w9", max_running=2).id == capped_jobs[0]
    assert _claim(engine, "w10", max_running=2) is None


def test_concurrent_claimers_never_run_more_of_a_tenants_jobs_than_its_cap(engine):
    tenant = _tenant(engine)
    _queue(engine, tenant, 12)
    claimers = 6
    start = threading.Barrier(claimers)
    won: list[str] = []
    errors: list[BaseException] = []

    def claim(worker_id: str) -> None:
        try:
            start.wait()
            for _ in range(4):  # 24 tries at 12 jobs
                if (job := _claim(engine, worker_id, max_running=3)) is not None:
                    won.append(job.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(won) == 3
    with Session(engine) as session:
        running = session.exec(select(func.count()).select_from(Job).where(Job.status == JobStatus.running)).one()
    assert running == 3


def test_a_job_that_keeps_losing_its_worker_fails_after_max_attempts(engine):
    (job_id,) = _submit(engine)
    for attempt in range(1, 4):
        assert _claim(engine, f"w{attempt}", max_attempts=3).attempts == attempt
        _expire_lease(engine, job_id)  # the job killed its worker again
    assert _claim(engine, "w4", max_attempts=3) is None
    job = load_job(engine, job_id)
    assert (job.status, job.stop_reason, job.worker_id) == (JobStatus.failed, StopReason.error, None)
    assert job.error.startswith("gave up after 3 attempts") and "ARTSVC_MAX_ATTEMPTS" in job.error
    with Session(engine) as session:
        finished = events_after(session, job_id=job_id)[-1]
    assert finished.kind == "finished" and finished.data["status"] == "failed" and finished.data["error"] == job.error
    (fresh,) = _submit(engine)
    assert _claim(engine, "w5", max_attempts=3).id == fresh  # the worker goes on to the next job


def test_a_job_cancelled_while_its_workers_kept_dying_ends_cancelled(engine):
    """Its owner asked for a cancel: out of attempts, it ends as asked (cancelled), not failed after retries."""
    (job_id,) = _submit(engine)
    for attempt in range(1, 4):
        assert _claim(engine, f"w{attempt}", max_attempts=3).attempts == attempt
        if attempt == 2:
            with Session(engine) as session:
                jobs.request_cancel(session, job=session.get(Job, job_id), requested_by="owner")
                session.commit()
        _expire_lease(engine, job_id)
    assert _claim(engine, "w4", max_attempts=3) is None
    job = load_job(engine, job_id)
    assert (job.status, job.stop_reason, job.error) == (JobStatus.cancelled, StopReason.cancelled, None)


def test_jobs_released_at_shutdown_keep_their_attempts(engine):
    (job_id,) = _submit(engine)
    for worker_id in ("w1", "w2", "w3", "w4"):  # four rolling restarts
        assert _claim(engine, worker_id, max_attempts=2).id == job_id
        with Session(engine) as session:
            assert leases.release(session, job_id=job_id, worker_id=worker_id)
            session.commit()
    assert _claim(engine, "w5", max_attempts=2).attempts == 1
