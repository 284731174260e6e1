"""The worker in this process: concurrent jobs, failures that do not stop it, a lease lost to another worker."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlmodel import Session

from service.settings import Settings
from service.store.events import events_after
from service.store.tables import Job, JobStatus, StopReason, WorkerRecord
from service.worker import leases, runners
from service.worker.runner import Worker
from tests.databases import sqlite_only
from tests.service.processes import LEASE_SECONDS
from tests.service.worker.conftest import LONGER_JOB, TINY_JOB, history, load_job, submit

ENDED = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


def _worker(engine, tmp_path, *, concurrency: int = 1, poll_seconds: float = 0.2) -> Worker:
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path / "data",
        lease_seconds=LEASE_SECONDS,
        poll_seconds=poll_seconds,
        worker_concurrency=concurrency,
    )
    return Worker(engine, settings, worker_id="test-worker")


async def _run_until(worker: Worker, done: Callable[[], bool]) -> None:
    """Run the worker until ``done()`` holds, then stop it the way SIGTERM does."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    while not done():
        if task.done():
            task.result()  # the worker ended early: raise what it raised
            pytest.fail("the worker stopped on its own")
        await asyncio.sleep(0.1)
    stop.set()
    await task


def _all_ended(engine, job_ids: list[str]) -> bool:
    return all(load_job(engine, job_id).status in ENDED for job_id in job_ids)


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_worker_with_concurrency_2_trains_two_jobs_at_once(engine, tmp_path):
    first, second = submit(engine, TINY_JOB), submit(engine, TINY_JOB)
    await _run_until(_worker(engine, tmp_path, concurrency=2), lambda: _all_ended(engine, [first, second]))
    a, b = load_job(engine, first), load_job(engine, second)
    assert a.status is b.status is JobStatus.succeeded and a.step == b.step == 4
    assert a.started_at < b.finished_at and b.started_at < a.finished_at  # their running times overlap
    assert history(engine, first) == history(engine, second)  # one seed, one history, even side by side
    with Session(engine) as session:
        record = session.get(WorkerRecord, "test-worker")
        assert record.concurrency == 2 and record.stopped_at is not None


@pytest.mark.asyncio
@pytest.mark.timeout(300)
@sqlite_only  # a job's failure is the worker's business, not the database's
async def test_a_failing_job_is_recorded_and_the_worker_goes_on_to_the_next(engine, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    serverless = {
        **TINY_JOB,
        "model": {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "backend": "serverless"},
    }  # no WANDB_API_KEY
    failing, fine = submit(engine, serverless), submit(engine, TINY_JOB)
    await _run_until(_worker(engine, tmp_path), lambda: _all_ended(engine, [failing, fine]))
    failed = load_job(engine, failing)
    assert failed.status is JobStatus.failed and failed.stop_reason is StopReason.error
    assert "WANDB_API_KEY" in failed.error
    assert load_job(engine, fine).status is JobStatus.succeeded


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_job_whose_lease_was_taken_over_stops_at_a_step_boundary_and_records_nothing_more(engine, tmp_path):
    job_id = submit(engine, LONGER_JOB)
    stolen_at: list[datetime] = []

    def steal_after_the_first_step() -> bool:
        """Another worker takes the job over (as if this one had stalled past its lease); done once this one
        reports, by a heartbeat after the theft, that it runs nothing."""
        with Session(engine) as session:
            if not stolen_at:
                job = session.get(Job, job_id)
                if job.status in ENDED:  # it ended before its first step: fail now, not at the test's timeout
                    pytest.fail(f"the job ended before a step was recorded: {job.status.value}: {job.error}")
                if history(engine, job_id)[0]:
                    job = session.get(Job, job_id)
                    stolen_at.append(leases.database_now(session))
                    job.worker_id, job.lease_expires_at = "thief", stolen_at[0] + timedelta(hours=1)
                    session.add(job)
                    session.commit()
                return False
            record = session.get(WorkerRecord, "test-worker")
            return record.heartbeat_at > stolen_at[0] and record.running_jobs == 0

    await _run_until(_worker(engine, tmp_path), steal_after_the_first_step)
    job = load_job(engine, job_id)
    assert job.status is JobStatus.running and job.worker_id == "thief"  # neither finished nor released by the loser
    steps, _ = history(engine, job_id)
    assert [s[0] for s in steps] == list(range(1, job.step + 1)) and job.step < LONGER_JOB["training"]["max_steps"]
    with Session(engine) as session:
        assert "finished" not in [e.kind for e in events_after(session, job_id=job_id)]


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_an_idle_worker_claims_a_job_as_soon_as_it_is_queued_not_at_its_next_poll(engine, tmp_path):
    """A job queued while the worker idles is claimed through the queue's signal (NOTIFY on PostgreSQL, the
    database's ``.queued`` file on SQLite), long before the worker's next poll would find it."""
    worker = _worker(engine, tmp_path, poll_seconds=600.0)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(1.0)  # registered, claimed nothing, now idle until its poll 600 s from now
        job_id = submit(engine, TINY_JOB)
        for _ in range(200):
            if load_job(engine, job_id).status is not JobStatus.queued:
                break
            await asyncio.sleep(0.05)
        assert load_job(engine, job_id).status is not JobStatus.queued
    finally:
        stop.set()
        await task


@pytest.mark.asyncio
async def test_a_worker_imports_its_runners_when_a_job_waits_and_before_it_claims_it(engine, tmp_path, monkeypatch):
    monkeypatch.setattr(runners, "runners", functools.cache(runners.runners.__wrapped__))  # this process's: unloaded
    worker, stop = _worker(engine, tmp_path), asyncio.Event()
    assert not await worker._ready(stop) and not runners.loaded()  # an empty queue imports nothing
    job_id = submit(engine, TINY_JOB)
    assert await worker._ready(stop) and runners.loaded()
    assert load_job(engine, job_id).status is JobStatus.queued  # imported first; the claim comes after
    stop.set()
    assert not await worker._ready(stop)


@pytest.mark.asyncio
async def test_a_worker_that_cannot_import_its_runners_says_so_and_claims_nothing(engine, tmp_path, monkeypatch, caplog):
    @functools.cache
    def broken_install() -> dict:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(runners, "runners", broken_install)
    job_id = submit(engine, TINY_JOB)
    with pytest.raises(ImportError):
        await _worker(engine, tmp_path)._ready(asyncio.Event())
    assert "cannot import its job runners" in caplog.text and "No module named 'torch'" in caplog.text
    assert load_job(engine, job_id).status is JobStatus.queued  # left for a worker that can run it
