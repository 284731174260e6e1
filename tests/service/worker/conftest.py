"""What the worker tests share: tiny jobs, and waiting on the store while worker processes (``start_worker`` of
tests/service/conftest.py) train them (``engine`` is the migrated store of tests/conftest.py, on SQLite and then
PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from sqlmodel import Session

from service.spec import JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.tables import Job, JobStatus, StopReason
from service.training.loop import run_job
from tests.service.processes import ServeProcess, WorkerProcess

T = TypeVar("T")
ENDED = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)

TINY_JOB = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {
        "warm_start_examples": 0,
        "max_steps": 4,
        "groups_per_step": 2,
        "group_size": 4,
        "learning_rate": 1e-3,
    },
    "validation": {"every_n_steps": 2, "max_examples": 8},
    "seed": 5,
}
LONGER_JOB = {  # lasts long enough to interrupt, and stops at max_steps rather than a plateau
    **TINY_JOB,
    "training": {**TINY_JOB["training"], "max_steps": 8},
    "validation": {**TINY_JOB["validation"], "patience": 10},
}


def submit(engine, spec: dict) -> str:
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec.model_validate(spec))
        session.commit()
        return job.id


def load_job(engine, job_id: str) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        return runs.get_job(session, job_id=job_id)


def history(engine, job_id: str) -> tuple[list[tuple], list[tuple]]:
    """Every step's (step, reward, loss, kl, completion length) and every validation point's (step, accuracy,
    greedy accuracy, outcomes): what a resume at the wrong step, or with the wrong seeds or weights, would change."""
    with Session(engine) as session:
        steps = [(s.step, s.reward_mean, s.loss, s.kl, s.completion_length) for s in runs.steps(session, job_id=job_id)]
        points = runs.validation_points(session, job_id=job_id)
        return steps, [(p.step, p.accuracy, p.greedy_accuracy, p.outcomes) for p in points]


def wait_for(
    check: Callable[[], T | None], *, what: str, timeout: float, workers: tuple[WorkerProcess | ServeProcess, ...] = ()
) -> T:
    """Poll ``check`` until it returns something truthy; fail with the logs of ``workers`` (worker processes, or the
    serve running them) if one exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        for worker in workers:
            if worker.process.poll() is not None:
                pytest.fail(
                    f"{worker.log_path.stem} exited with {worker.process.returncode} while waiting for {what}:\n{worker.log()}"
                )
        time.sleep(0.1)
    logs = "\n".join(worker.log() for worker in workers)
    pytest.fail(f"no {what} within {timeout}s:\n{logs}")


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[list[tuple], list[tuple]]:
    """The history of LONGER_JOB trained without interruption (same seed: the same numbers)."""
    root = tmp_path_factory.mktemp("reference")
    url = f"sqlite:///{root / 'store.db'}"
    store_db.upgrade(url)
    engine = store_db.make_engine(url)
    job_id = submit(engine, LONGER_JOB)
    asyncio.run(run_job(job_id, db=engine, data_dir=root / "data"))
    yield history(engine, job_id)
    engine.dispose()


def steps_recorded(engine, job_id: str, at_least: int) -> bool:
    """Whether the job has recorded ``at_least`` steps; fails at once if it ended without them."""
    if len(history(engine, job_id)[0]) >= at_least:
        return True
    if (job := load_job(engine, job_id)).status in ENDED:  # it will record no more: fail now, not at the timeout
        pytest.fail(f"the job ended after {job.step} steps: {job.status.value}: {job.error}")
    return False


def ended(engine, job_id: str) -> Job | None:
    job = load_job(engine, job_id)
    return job if job.status in ENDED else None


def assert_finished_like_the_reference(engine, job_id: str, reference, *, attempts: int) -> None:
    """LONGER_JOB succeeded with every step and validation point once, the same numbers as ``reference``."""
    job = load_job(engine, job_id)
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.max_steps, job.error
    steps, points = history(engine, job_id)
    assert [s[0] for s in steps] == list(range(1, 9))  # no gap, no duplicate
    assert [p[0] for p in points] == [0, 2, 4, 6, 8]
    assert (steps, points) == reference  # resumed at the right step with the same scenarios and seeds
    assert job.attempts == attempts and job.worker_id is None and job.lease_expires_at is None
