"""The hooks a worker steers its jobs with, the same for training and evaluation jobs: a job taken over by another
worker writes nothing more and is left to its new owner (the lease fence), and a worker shutting down stops an
evaluation at its next rollout and puts it back in the queue. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session

from service.evaluation.runner import run_evaluation
from service.runner.control import JobHooks, LeaseLost
from service.settings import Settings
from service.spec import EvaluationSpec
from service.store import runs
from service.store.events import events_after
from service.store.tables import Job, JobStatus
from service.training.loop import run_job
from service.worker import leases
from service.worker.runner import Worker
from tests.json_server import json_server
from tests.service.policy_server import reply
from tests.service.worker.conftest import TINY_JOB, load_job, submit

BASELINE = "openai/sloppy"


def claim(engine, worker_id: str) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        job = leases.claim_next(
            session, worker_id=worker_id, lease_seconds=60, max_running_per_tenant=1, max_attempts=3
        )
        session.commit()
    assert job is not None
    return job


def take_over(engine, job_id: str, *, by: str) -> None:
    """The holder stalled past its lease (its heartbeat has not noticed yet) and another worker claimed the job."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        job.lease_expires_at = leases.database_now(session) - timedelta(seconds=1)
        session.add(job)
        session.commit()
    assert claim(engine, by).id == job_id


def fence(job_id: str, worker_id: str) -> Callable[[Session], bool]:
    return lambda session: leases.renew(session, job_id=job_id, worker_id=worker_id, lease_seconds=60)


def event_kinds(engine, job_id: str) -> list[str]:
    with Session(engine) as session:
        return [e.kind for e in events_after(session, job_id=job_id)]


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_worker_whose_lease_was_taken_over_mid_job_writes_nothing_and_leaves_the_job_to_its_new_owner(
    engine, tmp_path
):
    job_id = submit(engine, TINY_JOB)
    claim(engine, "worker-a")

    def taken_over_after_step_1(kind: str, data: dict[str, Any]) -> None:
        if kind == "step" and data["step"] == 1:
            take_over(engine, job_id, by="worker-b")

    hooks = JobHooks(on_event=taken_over_after_step_1, holds_job=fence(job_id, "worker-a"))
    with pytest.raises(LeaseLost):  # at its next write: step 2's rows
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=hooks)
    job = load_job(engine, job_id)
    assert (job.status, job.worker_id, job.attempts, job.step, job.error) == (JobStatus.running, "worker-b", 2, 1, None)
    with Session(engine) as session:
        assert [s.step for s in runs.steps(session, job_id=job_id)] == [1]  # step 2 of worker A was dropped
    assert "finished" not in event_kinds(engine, job_id)  # nothing marked: the job is worker B's

    ended = await run_job(
        job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(holds_job=fence(job_id, "worker-b"))
    )
    assert ended.status is JobStatus.succeeded and ended.step == 4 and ended.error is None
    with Session(engine) as session:
        assert [s.step for s in runs.steps(session, job_id=job_id)] == [1, 2, 3, 4]
    assert event_kinds(engine, job_id).count("finished") == 1


@contextmanager
def gated_baseline(open_for: int) -> Iterator[tuple[str, threading.Event, Callable[[], int]]]:
    """The baseline models of tests/service/policy_server.py, answering the first ``open_for`` requests at once and
    holding the rest until ``gate`` is set; yields the API base, the gate and how many requests wait at it."""
    gate, lock, seen = threading.Event(), threading.Lock(), [0, 0]  # requests, and those waiting

    def answer(request: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with lock:
            seen[0] += 1
            held = seen[0] > open_for
            seen[1] += held
        if held:
            gate.wait(60)
        question = [m["content"] for m in request["messages"] if m["role"] == "user"][-1]  # after any few-shot turns
        message = {"role": "assistant", "content": reply(request["model"], question, request.get("seed"))}
        return 200, {"id": "chatcmpl-gated", "object": "chat.completion", "created": int(time.time()),
                     "model": request["model"], "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}, {}  # fmt: skip

    with json_server(answer) as url:
        try:
            yield f"{url}/v1", gate, lambda: seen[1]
        finally:
            gate.set()


def queue_evaluation(engine) -> str:
    spec = EvaluationSpec.model_validate({"model": {"litellm": BASELINE}, "environment": "math", "max_examples": 100})
    with Session(engine) as session:
        job = runs.create_evaluation(session, spec=spec, environment="math")
        session.commit()
        return job.id


def settings_for(tmp_path, api_base: str) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path / "data", lease_seconds=30, poll_seconds=0.2,
                    baseline_models=[BASELINE], baseline_api_base=api_base)  # fmt: skip  # no lapse on a busy machine


async def until(check: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout}s")
        await asyncio.sleep(0.05)


def assert_unrecorded(engine, job_id: str) -> None:
    """Nothing of the evaluation's measurement stored: no results, no summary, no end."""
    job = load_job(engine, job_id)
    assert job.summary is None and job.finished_at is None
    with Session(engine) as session:
        assert runs.example_results(session, job_id=job_id, step=0) == []
        progress = [e.data["done"] for e in events_after(session, job_id=job_id) if e.kind == "progress"]
    assert progress and max(progress) < 100
    assert "finished" not in event_kinds(engine, job_id)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_worker_shutting_down_stops_an_evaluation_at_its_next_rollout_and_requeues_it(engine, tmp_path):
    job_id = queue_evaluation(engine)
    with gated_baseline(open_for=20) as (api_base, gate, waiting):
        worker = Worker(engine, settings_for(tmp_path, api_base), worker_id="test-worker")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await until(
            lambda: task.done() or (waiting() > 0 and "progress" in event_kinds(engine, job_id)),
            what="progress recorded and a rollout waiting at the gate",
        )
        stop.set()  # SIGTERM, while rollouts are in flight
        await asyncio.sleep(0.5)  # the worker sees it
        gate.set()  # the rollouts in flight end: the first to end is the boundary the evaluation stops at
        await asyncio.wait_for(task, timeout=60)
    job = load_job(engine, job_id)
    assert (job.status, job.worker_id, job.lease_expires_at) == (JobStatus.queued, None, None)  # back in the queue
    assert_unrecorded(engine, job_id)
    with Session(engine) as session:
        released = [e.data for e in events_after(session, job_id=job_id) if e.kind == "queued"][-1]
    assert released["released_by"] == "test-worker"


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_an_evaluation_whose_lease_was_taken_over_stops_and_writes_nothing(engine, tmp_path):
    job_id = queue_evaluation(engine)
    claim(engine, "worker-a")
    with gated_baseline(open_for=20) as (api_base, gate, waiting):
        hooks = JobHooks(holds_job=fence(job_id, "worker-a"))
        settings = settings_for(tmp_path, api_base)
        task = asyncio.create_task(
            run_evaluation(job_id, db=engine, data_dir=settings.data_dir, settings=settings, hooks=hooks)
        )
        await until(
            lambda: task.done() or (waiting() > 0 and "progress" in event_kinds(engine, job_id)),
            what="progress recorded and a rollout waiting at the gate",
        )
        take_over(engine, job_id, by="worker-b")
        gate.set()
        with pytest.raises(LeaseLost):  # at its next progress mark
            await asyncio.wait_for(task, timeout=60)
    job = load_job(engine, job_id)
    assert (job.status, job.worker_id, job.attempts, job.error) == (JobStatus.running, "worker-b", 2, None)
    assert_unrecorded(engine, job_id)
