"""Long phases inside one job: a cancel takes effect within about a second in a warm start and in a step's rollouts
(the job ends cancelled, nothing of the phase recorded), a worker whose event loop a step keeps busy keeps its lease
(the heartbeat has a thread of its own), on SQLite and PostgreSQL; and a warm start holds a batch of demonstrations at
a time, not all of them."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterator

import pytest
from sqlmodel import Session

from environments.math.env import MathEnvironment
from service.backends import make_backend
from service.backends.models import trainable_model
from service.runner.control import JobHooks
from service.spec import JobSpec
from service.store import jobs
from service.store.tables import Job, JobStatus, StopReason
from service.training.loop import run_job
from service.training.run import Run
from service.training.warm_start import SIZING_SAMPLE, warm_start
from service.worker import leases
from service.worker.runner import Worker
from tests.databases import sqlite_only
from tests.service.worker.conftest import TINY_JOB, history, load_job, submit

# A check every second at most, and the phase's work in flight dropped: about 2 s on a quiet machine. The bound only
# tells "within seconds" from "when the phase ends" (a cancelled warm start ran on for 55.6 s before cancels reached
# into it), with room for a loaded machine (3.9 s seen beside four busy processes).
CANCEL_WITHIN_S = 10.0


def cancel(engine, job_id: str) -> float:
    """Cancel the job as a client would; when (time.monotonic())."""
    with Session(engine) as session:
        jobs.request_cancel(session, job=session.get(Job, job_id), requested_by="test")
        session.commit()
    return time.monotonic()


async def run_and_cancel(engine, tmp_path, spec: dict, *, after_s: float, on: str | None) -> tuple[float, Job]:
    """Run ``spec`` and cancel it ``after_s`` after its first ``on`` event (None: after it starts); the seconds from
    the cancel to the job's end, and the job as it ended."""
    job_id = submit(engine, spec)
    loop, asked = asyncio.get_running_loop(), []

    def cancel_soon(kind: str | None = None, _: dict | None = None) -> None:
        if kind == on and not asked:
            asked.append(loop.call_later(after_s, lambda: asked.append(cancel(engine, job_id))))

    if on is None:
        cancel_soon()
    ended = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=cancel_soon))
    return time.monotonic() - asked[-1], ended


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_cancel_during_a_warm_start_ends_the_job_cancelled_within_seconds(engine, tmp_path):
    spec = {**TINY_JOB, "training": {**TINY_JOB["training"], "warm_start_examples": 10_000}}  # a minute or so
    latency, ended = await run_and_cancel(engine, tmp_path, spec, after_s=2.0, on=None)
    assert (ended.status, ended.stop_reason) == (JobStatus.cancelled, StopReason.cancelled)
    assert latency < CANCEL_WITHIN_S and history(engine, ended.id) == ([], [])


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_cancel_during_a_step_s_rollouts_drops_them_and_ends_the_job_cancelled_within_seconds(engine, tmp_path):
    training = {**TINY_JOB["training"], "max_steps": 1, "groups_per_step": 64, "group_size": 16}  # 1024 rollouts
    spec = {**TINY_JOB, "training": training, "validation": {"max_examples": 2}}
    latency, ended = await run_and_cancel(engine, tmp_path, spec, after_s=1.0, on="validation")
    assert (ended.status, ended.stop_reason) == (JobStatus.cancelled, StopReason.cancelled)
    steps, points = history(engine, ended.id)
    assert latency < CANCEL_WITHIN_S and steps == [] and [p[0] for p in points] == [0]


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_step_that_keeps_the_event_loop_busy_keeps_the_job_s_lease(engine, settings):
    job_id = submit(engine, TINY_JOB)
    worker = Worker(engine, settings.model_copy(update={"lease_seconds": 1, "poll_seconds": 0.05}))
    stop = asyncio.Event()
    working = asyncio.create_task(worker.run(stop))
    while load_job(engine, job_id).status is not JobStatus.running:
        await asyncio.sleep(0.05)
    time.sleep(3)  # synchronous work on the event loop, three leases long: nothing else on the loop runs meanwhile
    with Session(engine) as session:
        job, now = load_job(engine, job_id), leases.database_now(session)
    assert job.worker_id == worker.id and job.lease_expires_at > now  # renewed all along: no other worker takes it
    cancel(engine, job_id)
    stop.set()
    await working
    assert load_job(engine, job_id).status is JobStatus.cancelled


class CountedMath(MathEnvironment):
    """Math whose demonstrations count how many of them are alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.alive = self.most_alive = 0

    def demonstrations(self, *, seed: int, count: int) -> Iterator:
        for demo in super().demonstrations(seed=seed, count=count):
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
            weakref.finalize(demo, self._died)
            yield demo

    def _died(self) -> None:
        self.alive -= 1


@sqlite_only
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_warm_start_holds_a_batch_or_two_of_its_demonstrations_at_a_time_not_all(engine, tmp_path):
    spec_dict = {**TINY_JOB, "training": {**TINY_JOB["training"], "warm_start_examples": 640}}
    job_id, spec, env = submit(engine, spec_dict), JobSpec.model_validate(spec_dict), CountedMath()
    backend = make_backend(spec.model.backend, data_dir=tmp_path, seed=spec.seed)
    model = trainable_model(job_id, spec, env, tmp_path)
    batches = []
    try:
        await model.register(backend)
        run = Run(job_id, spec, env, model, backend, engine, JobHooks(on_event=lambda kind, data: batches.append(data)))
        await warm_start(run)
    finally:
        await backend.close()
    assert batches[-1]["batch"] == batches[-1]["batches"] == 10  # 64 a batch: one reply each
    assert env.most_alive == SIZING_SAMPLE  # the sample that sizes the batches; then a batch or two at a time
