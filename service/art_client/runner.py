"""The run of a ``client_batch`` job: one GRPO step on the groups ART's client posted, through the transformers
backend (ART's tokenisation, packing and loss), recorded on the model's series job and told to the client as the
events it polls (``training_started``, ``gradient_step``, ``training_ended`` or ``training_failed``).

The step, the model's recorded step, the batch's own step and its ``gradient_step`` event are one transaction: a crash
before it leaves the job to be claimed again, and the run first rolls the checkpoints back to the recorded step (a
checkpoint the crashed run wrote is dropped), so a step is neither lost nor taken twice; a crash after it resumes past
the training. A validated model (registry.py) is validated on its environment before its first step and after each
step that is due, and its series stops by the job's rules; then ``training_ended`` and the batch's end commit
together. A model's batches run one at a time, oldest first (service/worker/leases.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import art
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

import environments
from service.alerts import check_alerts
from service.art_client import batches, registry
from service.backends import layout, make_backend
from service.runner.control import JobCancelled, JobHooks, JobInterrupted, StopCheck, fenced
from service.runner.finish import finish
from service.settings import Settings, get_settings
from service.spec import JobSpec
from service.store import runs
from service.store.events import append_event
from service.store.records import StepCost
from service.store.tables import ClientModel, Job, JobEvent, JobStatus, StopReason
from service.training.loop import validate_if_due
from service.training.run import Run, sampled
from service.training.step import step_values

WARM_IDLE_S = 120.0  # how long a worker keeps the model it trained last loaded for the model's next batch


class WarmModel:
    """The client model this process trained last, kept loaded for that model's next batch: a model's batches come
    one after another, and loading the base model and adapter again cost about 2 s a step on 2 cores (as much as the
    step's training; bench/art_client.py). One at a time, closed after WARM_IDLE_S unused or when another replaces
    it; taken only while its engine is at the model's recorded step (else another worker trained it since)."""

    def __init__(self) -> None:
        self._held: tuple[str, art.Backend, art.TrainableModel] | None = None
        self._expiry: asyncio.TimerHandle | None = None

    async def take(self, series_id: str, recorded_step: int) -> tuple[art.Backend, art.TrainableModel] | None:
        held, self._held = self._held, None
        if self._expiry is not None:
            self._expiry.cancel()
        if held is None:
            return None
        if held[0] == series_id and await held[2].get_step() == recorded_step:
            return held[1], held[2]
        await held[1].close()
        return None

    async def keep(self, series_id: str, backend: art.Backend, model: art.TrainableModel) -> None:
        await self.close()
        self._held = (series_id, backend, model)
        self._expiry = asyncio.get_running_loop().call_later(WARM_IDLE_S, lambda: asyncio.ensure_future(self.close()))

    async def close(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            await held[1].close()


WARM = WarmModel()  # this process's


class Untrainable(Exception):
    """The batch cannot train its model; the message is the client's ``training_failed`` reason."""


async def run_client_batch(
    job_id: str, *, db: Engine, data_dir: Path, settings: Settings | None = None, hooks: JobHooks | None = None
) -> Job:
    """Train the job's batch into its model's next step (the runner shape of service/runner/finish.py). A batch that
    cannot train (nothing trainable, the model stopped, a trajectory too long) ends the job failed with the reason as
    its ``training_failed`` event; a cancel, cancelled with one too."""
    hooks = hooks or JobHooks()
    settings = settings or get_settings()
    with fenced(db, hooks, job_id) as session:
        job = runs.start_run(session, job_id=job_id)
        model, series = _model_of(session, job)
        if not _has_event(session, job_id, "training_started"):
            append_event(session, job_id=job_id, kind="training_started", data={"num_sequences": 1})
    trained = job.step > 0  # its step was recorded by an earlier run of this job
    stop = StopCheck(db, hooks, job_id)
    backend: art.Backend | None = None
    path = batches.path_of(data_dir, job_id)
    try:
        if not trained and series.status is not JobStatus.running:
            raise Untrainable(f"model {model.entity}/{model.project}/{model.name} has stopped training: "
                              f"{series.stop_reason.value if series.stop_reason else series.status.value}")  # fmt: skip
        limit = settings.client_batch_max_trajectories
        batch = None if trained else await asyncio.to_thread(batches.read, path, max_trajectories=limit)
        if batch is not None and (reason := batch.why_untrainable()) is not None:
            raise Untrainable(reason)
        groups = batch.trajectory_groups() if batch is not None else []
        spec = JobSpec.model_validate(series.spec)
        if (warm := await WARM.take(series.id, model.step)) is not None:
            backend, trainable = warm
        else:
            backend = make_backend("transformers", data_dir=data_dir, seed=0, precision=settings.precision,
                                   max_sequence_tokens=settings.client_max_sequence_tokens,
                                   activation_memory_gib=settings.activation_memory_gib)  # fmt: skip
            name = layout.job_model_name(series.id, spec.model.name)
            trainable = art.TrainableModel(name=name, project=layout.PROJECT, base_model=model.base_model,
                                           base_path=str(data_dir / "art"))  # fmt: skip
            await stop.guard(trainable.register(backend))
            if await trainable.get_step() > model.step:  # written by a run that crashed before recording it
                await backend._delete_checkpoint_files(trainable, list(range(model.step + 1)))
        run = _validation_run(series, spec, trainable, backend, db, hooks)
        if run is not None and model.step == 0:
            await stop.guard(validate_if_due(run, 0))  # the base model's point, before the first step
        if batch is not None:
            started = time.monotonic()
            try:
                result = await stop.guard(backend.train(trainable, groups, **batch.config.train_options()))
            except ValueError as exc:  # the engine's refusals (a trajectory too long), before any change
                raise Untrainable(str(exc)) from None
            job = _record_step(db, hooks, job_id, groups, result, train_s=time.monotonic() - started)
        if run is not None and (decision := await stop.guard(validate_if_due(run, job.step))).stop_reason is not None:
            finish(db, hooks, series.id, status=JobStatus.succeeded, stop_reason=decision.stop_reason,
                   decision=decision)  # fmt: skip
        ended = _end(db, hooks, job_id)
        path.unlink(missing_ok=True)
        await WARM.keep(series.id, backend, trainable)
        backend = None  # kept loaded, not closed
        return ended
    except JobInterrupted:
        raise
    except JobCancelled:
        return _fail(db, hooks, job_id, "the training job was cancelled", status=JobStatus.cancelled, path=path)
    except (Untrainable, batches.BadBatch) as exc:
        return _fail(db, hooks, job_id, str(exc), status=JobStatus.failed, path=path)
    except Exception as exc:
        _fail(db, hooks, job_id, f"{type(exc).__name__}: {exc}", status=JobStatus.failed, path=path)
        raise
    finally:
        if backend is not None:
            await backend.close()


def _validation_run(series: Job, spec: JobSpec, model: art.TrainableModel, backend: art.Backend, db: Engine,
                    hooks: JobHooks) -> Run | None:  # fmt: skip
    """What validating a validated model's checkpoints takes (its writes fenced by this batch's lease); None for a
    model that is not validated."""
    if not registry.validated(series):
        return None
    env = environments.load(spec.environment, spec.environment_args)
    return Run(series.id, spec, env, model, backend, db, hooks)


def _record_step(db: Engine, hooks: JobHooks, job_id: str, groups: list[art.TrajectoryGroup],
                 result: art.types.TrainResult, *, train_s: float) -> Job:  # fmt: skip
    """The step on the model's series, its checkpoint listed (the model's step), the batch's step and its
    ``gradient_step`` event: one transaction."""
    values = step_values(groups, result.metrics, cost=StepCost(train_s=train_s), wall_time_s=train_s)
    with fenced(db, hooks, job_id) as session:
        job = runs.get_job(session, job_id=job_id)
        model, series = _model_of(session, job)
        runs.record_step(session, job=series, step=result.step, values=values)
        rows = sampled([g.trajectories for g in groups], hooks.trajectories_per_step)
        runs.record_trajectories(session, job=series, step=result.step, split="train", rows=rows)
        alerts = check_alerts(session, job=series, spec=JobSpec.model_validate(series.spec))
        model.step = job.step = result.step
        session.add_all([model, job])
        metrics = {key: float(value) for key, value in result.metrics.items()}
        append_event(session, job_id=job_id, kind="gradient_step", step=result.step, data=metrics)
    hooks.on_alert(alerts)
    return job


def _end(db: Engine, hooks: JobHooks, job_id: str) -> Job:
    """``training_ended`` (the step's checkpoint is listed by then) and the batch's end, together."""
    with fenced(db, hooks, job_id) as session:
        job = runs.get_job(session, job_id=job_id)
        append_event(session, job_id=job_id, kind="training_ended", step=job.step, data={"step": job.step})
        runs.finish_job(session, job=job, status=JobStatus.succeeded, stop_reason=None)
    return job


def _fail(db: Engine, hooks: JobHooks, job_id: str, message: str, *, status: JobStatus, path: Path) -> Job:
    with fenced(db, hooks, job_id) as session:
        job = runs.get_job(session, job_id=job_id)
        append_event(session, job_id=job_id, kind="training_failed", data={"error_message": message})
        reason = StopReason.cancelled if status is JobStatus.cancelled else StopReason.error
        runs.finish_job(session, job=job, status=status, stop_reason=reason, error=message)
    path.unlink(missing_ok=True)
    return job


def _model_of(session: Session, job: Job) -> tuple[ClientModel, Job]:
    model = session.exec(select(ClientModel).where(col(ClientModel.job_id) == job.parent_id)).one()
    series = runs.get_job(session, job_id=model.job_id)
    assert series is not None
    return model, series


def _has_event(session: Session, job_id: str, kind: str) -> bool:
    query = select(JobEvent.id).where(col(JobEvent.job_id) == job_id, col(JobEvent.kind) == kind).limit(1)
    return session.exec(query).first() is not None
