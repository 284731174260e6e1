"""Worker processes that die or are stopped mid-job: another worker finishes the job, every step recorded once."""

from __future__ import annotations

import os
import signal

import pytest
from sqlmodel import Session, select

from service.store.tables import JobStatus, WorkerRecord
from tests.databases import sqlite_only
from tests.service.worker.conftest import (
    LONGER_JOB,
    assert_finished_like_the_reference,
    ended,
    history,
    load_job,
    steps_recorded,
    submit,
    wait_for,
)


@pytest.mark.timeout(600)
def test_a_killed_worker_s_job_is_taken_over_and_finished_without_lost_or_duplicated_steps(
    engine, start_worker, reference
):
    job_id = submit(engine, LONGER_JOB)
    doomed = start_worker()
    wait_for(lambda: steps_recorded(engine, job_id, 2), what="2 recorded steps", timeout=180, workers=(doomed,))
    os.kill(doomed.process.pid, signal.SIGKILL)
    doomed.process.wait()
    held = load_job(engine, job_id)
    assert held.status is JobStatus.running and held.attempts == 1  # the dead worker's lease still stands

    successor = start_worker()
    wait_for(lambda: ended(engine, job_id), what="the job's end", timeout=240, workers=(successor,))
    assert_finished_like_the_reference(engine, job_id, reference, attempts=2)
    assert load_job(engine, job_id).step == 8


@pytest.mark.timeout(600)
@sqlite_only  # the process's side of a stop; the release on PostgreSQL is tested in test_leases.py
def test_sigterm_checkpoints_the_current_step_and_hands_the_job_back(engine, start_worker, reference):
    job_id = submit(engine, LONGER_JOB)
    first = start_worker()
    wait_for(lambda: steps_recorded(engine, job_id, 2), what="2 recorded steps", timeout=180, workers=(first,))
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=120) == 0, first.log()

    released = load_job(engine, job_id)
    assert released.status is JobStatus.queued and released.worker_id is None and released.lease_expires_at is None
    steps, _ = history(engine, job_id)
    assert [s[0] for s in steps] == list(range(1, released.step + 1)) and released.step >= 2
    assert steps == reference[0][: released.step]  # the steps done so far are kept as they were
    with Session(engine) as session:
        (record,) = session.exec(select(WorkerRecord)).all()
        assert record.stopped_at is not None and record.running_jobs == 0

    second = start_worker()
    wait_for(lambda: ended(engine, job_id), what="the job's end", timeout=240, workers=(second,))
    assert_finished_like_the_reference(engine, job_id, reference, attempts=1)  # the release gave its claim back
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=60) == 0, second.log()
