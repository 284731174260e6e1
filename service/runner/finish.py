"""The one shape of a job runner: the signature the worker calls every kind by (:class:`Runner`) and the one way a
run ends (:func:`finish`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from service.runner.control import JobHooks, fenced
from service.runner.stopping import Decision
from service.settings import Settings
from service.store import runs
from service.store.tables import Job, JobStatus, StopReason


class Runner(Protocol):
    """Run (or resume) job ``job_id`` to its recorded end and return its row. A failure is recorded on the job, then
    raised; an interruption (JobInterrupted, LeaseLost) records nothing. ``settings`` default to the process's."""

    async def __call__(
        self, job_id: str, *, db: Engine, data_dir: Path, settings: Settings | None = None, hooks: JobHooks | None = None
    ) -> Job: ...


def finish(
    db: Engine,
    hooks: JobHooks,
    job_id: str,
    *,
    status: JobStatus,
    stop_reason: StopReason | None,
    decision: Decision | None = None,
    error: str | None = None,
    measured: tuple[dict[str, Any], list[dict[str, Any]]] | None = None,
) -> Job:
    """Record how the job ended, in one fenced transaction (LeaseLost, writing nothing, if another process holds it):
    its status and stop reason, the best validation point (the ``decision``'s, else the best recorded: a failed run
    still reports it; an evaluation has none), the step-0 accuracy and the base model's before its warm start, and an
    evaluation's ``measured`` summary and per-example rows."""
    with fenced(db, hooks, job_id) as session:
        job = runs.get_job(session, job_id=job_id)
        if measured is not None:
            summary, rows = measured
            runs.record_example_results(session, job=job, step=0, rows=rows)
            job.summary = summary
        points = runs.validation_points(session, job_id=job_id)
        base = runs.base_point(session, job_id=job_id)
        best = decision if decision is not None and decision.best_step is not None else None
        if best is None and points:
            best_point = max(points, key=lambda p: (p.accuracy, -p.step))
            best = Decision(None, best_point.step, best_point.accuracy, 0)
        runs.finish_job(
            session,
            job=job,
            status=status,
            stop_reason=stop_reason,
            best_step=best.best_step if best else None,
            best_val_accuracy=best.best_accuracy if best else None,
            step0_val_accuracy=next((p.accuracy for p in points if p.step == 0), None),
            base_val_accuracy=base.accuracy if base is not None else None,
            error=error,
        )
    return job
