"""Submitting work, checked once: a training job (POST /v1/jobs and ``artsvc train``) or an evaluation
(POST /v1/evaluations) is checked here against the installed environments and the operator's policy (judges,
baselines, per-job limits, what a client token may use, its queue), gets its manifest, and is queued idempotently.
The worker trusts the stored spec and refreshes only what can change before the job runs (``manifests.refreshed``,
``training.judging.judge_for``, ``evaluation.plan.resolve``).

A refusal is a ``Refused`` carrying the HTTP status the API answers with; the command line prints its message.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

import environments
from environments.base import Environment
from service import manifests, tenancy
from service.auth import Principal
from service.evaluation.plan import EvaluationError, manifest_for, resolve
from service.settings import Settings
from service.spec import CheckpointModel, EvaluationSpec, JobSpec
from service.store import db as store_db
from service.store import jobs, runs
from service.store.tables import Job, JobStatus


class Refused(Exception):
    """A submission this server will not take. ``str()`` is the reason, naming the field or the setting (the API's
    ``detail``); ``status`` is the HTTP status the API answers with, ``headers`` the response's extra headers."""

    status: ClassVar[int] = 422
    headers: ClassVar[dict[str, str] | None] = None


class KeyConflict(Refused):
    """The idempotency key was used before with a different spec."""

    status = 409


class NotEnded(Refused):
    """The job whose checkpoint an evaluation would measure is still queued or running."""

    status = 409


class QueueFull(Refused):
    """The caller has as many jobs and evaluations queued as the operator allows; it may retry later."""

    status = 429
    headers = tenancy.RETRY_LATER


def submit(
    session: Session, spec: JobSpec, *, caller: Principal, settings: Settings, idempotency_key: str | None = None
) -> tuple[Job, bool]:
    """Queue the training job ``spec`` for ``caller``, with its manifest, and commit: the job and False; or the job an
    earlier submission with the same ``idempotency_key`` made and True (a replay is never refused for a full queue).
    Raises Refused for an environment, judge, baseline or limit this server refuses, KeyConflict, QueueFull."""
    job = prepare(spec, caller=caller, settings=settings, idempotency_key=idempotency_key)
    return queue_in_turn(session, job, caller=caller, settings=settings)


def prepare(spec: JobSpec, *, caller: Principal, settings: Settings, idempotency_key: str | None = None) -> Job:
    """The job ``spec`` would queue for ``caller``, checked and with its manifest, not yet in the store: everything
    a submission does before its write (no store work). Raises Refused as ``submit`` does."""
    env = _environment(spec.environment, spec.environment_args)
    try:
        spec = manifests.recommended_spec(spec, env)
    except ValueError as exc:
        raise Refused(f"environment {spec.environment!r} recommends settings this server refuses: {exc}") from None
    if (refusal := settings.refuse_reward(spec.reward)) is not None:
        raise Refused(refusal)
    if (baseline := spec.validation.baseline_model) is not None:
        if (refusal := settings.refuse_baseline(baseline, field="validation.baseline_model")) is not None:
            raise Refused(refusal)
    if (refusal := tenancy.refuse_job(spec, env, caller=caller, settings=settings)) is not None:
        raise Refused(refusal)
    job = runs.new_job(spec=spec, owner_id=caller.id, idempotency_key=idempotency_key, request_hash=jobs.request_hash(spec))
    job.manifest = manifests.training_manifest(spec, env)
    return job


def queue_in_turn(session: Session, job: Job, *, caller: Principal, settings: Settings) -> tuple[Job, bool]:
    """``queue_once`` in the API writers' turn (store/db.py ``one_writer``), which holds the idempotency and queue
    checks, the insert and the commit, and nothing that could be done before it (``prepare``)."""
    with store_db.one_writer(session.get_bind()):
        return queue_once(session, job, caller=caller, settings=settings)


def submit_evaluation(session: Session, spec: EvaluationSpec, *, caller: Principal, settings: Settings) -> Job:
    """Queue the evaluation ``spec`` for ``caller``, with its manifest, and commit. Whether the caller may see the
    job it evaluates is the API's to answer first (a 404). Raises NotEnded, Refused (a model, checkpoint or
    environment it cannot measure), QueueFull."""
    if isinstance(spec.model, CheckpointModel):
        evaluated = runs.get_job(session, job_id=spec.model.job_id)
        if evaluated is not None and evaluated.status in (JobStatus.queued, JobStatus.running):
            status = evaluated.status.value
            raise NotEnded(f"job {evaluated.id} is {status}; evaluate its checkpoints once it has ended")
    try:
        resolved = resolve(session, spec, settings)
    except EvaluationError as exc:
        raise Refused(str(exc)) from None
    manifest = manifest_for(spec, resolved)
    with store_db.one_writer(session.get_bind()):
        tenancy.hold_queue(session, caller=caller)
        _refuse_full_queue(session, caller=caller, settings=settings)
        job = runs.create_evaluation(session, spec=spec, environment=resolved.env.name, owner_id=caller.id)
        job.manifest = manifest
        session.commit()
    return job


def _environment(name: str, args: dict[str, Any]) -> Environment:
    """The environment ``name`` built with ``args`` (constructors are cheap by contract); Refused naming the field."""
    if name not in environments.available():
        names = ", ".join(sorted(environments.available())) or "none"
        raise Refused(f"environment: unknown environment {name!r}; installed: {names}")
    try:
        return environments.load(name, args)
    except environments.EnvironmentConfigError as exc:
        raise Refused(f"environment_args: {exc}") from None


def queue_once(session: Session, job: Job, *, caller: Principal, settings: Settings) -> tuple[Job, bool]:
    """``job`` (from ``prepare``) queued and committed, and False; or the job an earlier request with the same key made,
    and True. Raises KeyConflict, QueueFull. Call it in the writers' turn (``queue_in_turn``)."""
    tenancy.hold_queue(session, caller=caller)  # until this transaction ends: a concurrent twin of this request waits
    if (earlier := _earlier(session, job)) is not None:
        session.commit()
        return earlier, True
    _refuse_full_queue(session, caller=caller, settings=settings)
    try:
        runs.insert_queued(session, job)
        session.commit()
    except IntegrityError:  # a concurrent request with the same key committed first (its insert or commit fails)
        session.rollback()
        if (earlier := _earlier(session, job)) is None:
            raise
        return earlier, True
    return job, False


def _earlier(session: Session, job: Job) -> Job | None:
    """The job an earlier submission with ``job``'s idempotency key made, if any."""
    if job.idempotency_key is None:
        return None
    try:
        return jobs.earlier_submission(session, owner_id=job.owner_id, idempotency_key=job.idempotency_key,
                                       request_hash=job.request_hash)  # fmt: skip
    except jobs.IdempotencyConflict as exc:
        raise KeyConflict(str(exc)) from None


def _refuse_full_queue(session: Session, *, caller: Principal, settings: Settings) -> None:
    """QueueFull, the transaction rolled back, when ``caller``'s queue is full; after ``tenancy.hold_queue``."""
    if (refusal := tenancy.refuse_queue(session, caller=caller, settings=settings)) is not None:
        session.rollback()
        raise QueueFull(refusal)
