"""Store rows for the read-side API tests, written with the store's own functions instead of training."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.auth import create_token
from service.spec import JobSpec
from service.store import runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import Alert, AlertState, Job, JobStatus, Role, StopReason, WorkerRecord, utcnow

SPEC = JobSpec.model_validate({"environment": "math"})


def principal(engine: Engine, role: Role = Role.client, name: str = "test") -> tuple[str, dict[str, str]]:
    """A new token: its id (the owner of the jobs it submits) and the Authorization header to send."""
    with Session(engine) as session:
        row, secret = create_token(session, role=role, name=name)
        session.commit()
        return row.id, {"Authorization": f"Bearer {secret}"}


def new_job(engine: Engine, *, owner_id: str) -> str:
    with Session(engine) as session:
        job = runs.create_job(session, spec=SPEC, owner_id=owner_id)
        session.commit()
        return job.id


def start(engine: Engine, job_id: str) -> None:
    with Session(engine) as session:
        runs.mark_running(session, job=session.get(Job, job_id))
        session.commit()


def record(engine: Engine, job_id: str, step: int, *, reward: float = 0.5, accuracy: float | None = None) -> None:
    """Training step ``step`` (step 0 records only validation), with a validation point when ``accuracy`` is given."""
    with Session(engine) as session:
        job = session.get(Job, job_id)
        if step > 0:
            values = dict(reward_mean=reward, reward_std=0.1, groups=2, zero_variance_groups=0,
                          completion_length=5.0, wall_time_s=0.1)  # fmt: skip
            runs.record_step(session, job=job, step=step, values=StepCreate(**values))
        if accuracy is not None:
            values = dict(accuracy=accuracy, examples=8, temperature=1.0, wall_time_s=0.1)
            runs.record_validation(session, job=job, step=step, values=ValidationCreate(**values))
        session.commit()


def finish(engine: Engine, job_id: str, status: JobStatus = JobStatus.succeeded) -> None:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        runs.finish_job(session, job=job, status=status, stop_reason=StopReason.max_steps,
                        best_step=job.step, best_val_accuracy=0.5, step0_val_accuracy=0.1)  # fmt: skip
        session.commit()


def alert(engine: Engine, job_id: str, *, kind: str, step: int, state: AlertState = AlertState.open) -> int:
    with Session(engine) as session:
        row = Alert(job_id=job_id, kind=kind, step=step, message=f"{kind} at step {step}",
                    evidence={"val": [0.5, 0.4], "reward": [0.2, 0.6]}, state=state)  # fmt: skip
        session.add(row)
        session.commit()
        return row.id


def worker(engine: Engine, worker_id: str, *, concurrency: int, running_jobs: int, age_s: float = 0,
           stopped: bool = False) -> None:  # fmt: skip
    """A worker record whose last heartbeat was ``age_s`` seconds ago."""
    beat = utcnow() - timedelta(seconds=age_s)
    record = WorkerRecord(id=worker_id, hostname="test", pid=1, concurrency=concurrency, running_jobs=running_jobs,
                          heartbeat_at=beat, stopped_at=beat if stopped else None)  # fmt: skip
    with Session(engine) as session:
        session.add(record)
        session.commit()
