"""What the worker tests share: tiny jobs, worker processes, and waiting on the store (``engine`` is the
migrated store of tests/conftest.py, on SQLite and then PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlmodel import Session

from service.spec import JobSpec
from service.store import runs
from service.store.tables import Job

T = TypeVar("T")

TINY_JOB = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {
        "warm_start_examples": 0, "max_steps": 4, "groups_per_step": 2, "group_size": 4, "learning_rate": 1e-3
    },  # fmt: skip
    "validation": {"every_n_steps": 2, "max_examples": 8},
    "seed": 5,
}
LONGER_JOB = {  # lasts long enough to interrupt, and stops at max_steps rather than a plateau
    **TINY_JOB,
    "training": {**TINY_JOB["training"], "max_steps": 8},
    "validation": {**TINY_JOB["validation"], "patience": 10},
}
LEASE_SECONDS = 3


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


def wait_for(check: Callable[[], T | None], *, what: str, timeout: float, workers: tuple[WorkerProcess, ...] = ()) -> T:
    """Poll ``check`` until it returns something truthy; fail with the workers' logs if they die or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        for worker in workers:
            if worker.process.poll() is not None:
                pytest.fail(f"worker exited with {worker.process.returncode} while waiting for {what}:\n{worker.log()}")
        time.sleep(0.1)
    logs = "\n".join(worker.log() for worker in workers)
    pytest.fail(f"no {what} within {timeout}s:\n{logs}")


class WorkerProcess:
    """``python -m service worker`` as a child process, its stderr in a file."""

    def __init__(self, *, database_url: str, data_dir: Path, log_path: Path, args: tuple[str, ...] = ()) -> None:
        env = {
            **os.environ,
            "ARTSVC_DATABASE_URL": database_url,
            "ARTSVC_DATA_DIR": str(data_dir),  # shared by every worker: the checkpoints live there
            "ARTSVC_LEASE_SECONDS": str(LEASE_SECONDS),
            "ARTSVC_POLL_SECONDS": "0.2",
        }
        self.log_path = log_path
        with open(log_path, "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service", "worker", *args],
                env=env,
                cwd=log_path.parent,  # away from any .env file of the repository
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def log(self) -> str:
        return f"--- {self.log_path.name} ---\n{self.log_path.read_text()}"


@pytest.fixture
def start_worker(engine, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes on the test's store and data folder; any still running are killed at the end."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(
            database_url=engine.url.render_as_string(hide_password=False),
            data_dir=tmp_path / "data",
            log_path=tmp_path / f"worker-{len(started) + 1}.log",
            args=args,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
