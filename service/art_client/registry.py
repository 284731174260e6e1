"""Models ART's client registers: one row per (token, entity, project, name), each with the training job that holds
its series. The job runs unleased (no worker claims it) until the model is deleted or stops on a rule; the batches the
client posts train it (batches.py, runner.py). A model whose project is an installed environment's name ("math",
"2048", "email", a plugin's) is validated on that environment's val split and stops by a job's rules (plateau,
target, divergence, max steps); once stopped it takes no more training jobs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import environments
from service import checkpoints
from service.auth import Principal
from service.backends import layout
from service.settings import Settings
from service.spec import DEFAULT_PRETRAINED_MODEL, JobSpec, ModelSpec, ValidationSpec
from service.store import runs
from service.store.events import append_event
from service.store.tables import ClientModel, Job, JobKind, JobStatus, TrainingStep, utcnow

ENVIRONMENT = "art-client"  # the series job's environment when the project names none: the rollouts are the client's


def validated(job: Job) -> bool:
    """Whether the series job validates its checkpoints (its project named an installed environment)."""
    return job.environment != ENVIRONMENT
DEFAULT_ENTITY = "artsvc"  # a model registered without an entity (ART sends null unless the user set one)


class NotAllowed(ValueError):
    """The base model is not one the operator lets this token train."""


class InvalidModel(ValueError):
    """The model's fields make no job spec (a base model the transformers backend cannot name, say)."""


class BaseModelMismatch(ValueError):
    """A model of that name exists with another base model."""


@dataclass(frozen=True)
class Registered:
    model: ClientModel
    created: bool


def allowed_base_model(base_model: str, *, caller: Principal, settings: Settings) -> str | None:
    """Why ``caller`` may not train ``base_model``, naming the setting; None if it may (as for jobs: the default, the
    operator's list, or any for operators)."""
    listed = settings.client_base_models
    if caller.is_operator or base_model == DEFAULT_PRETRAINED_MODEL or base_model in listed or "*" in listed:
        return None
    allowed = ", ".join([DEFAULT_PRETRAINED_MODEL, *listed])
    return (f"base_model: {base_model!r} is not a base model this server lets client tokens use; allowed: {allowed} "
            "(the operator sets ARTSVC_CLIENT_BASE_MODELS)")


def register(session: Session, *, caller: Principal, entity: str | None, project: str, name: str, base_model: str,
             settings: Settings, validation: ValidationSpec | None = None) -> Registered:  # fmt: skip
    """The caller's model of that name, made now with its series job (committed) unless it exists. A ``project``
    named as an installed environment makes a validated model: its checkpoints are validated on the environment's
    val split (``validation``: how; the defaults of a job if None) and its series stops by the job's rules.
    NotAllowed, InvalidModel, BaseModelMismatch."""
    entity = entity or DEFAULT_ENTITY
    if (existing := find(session, owner_id=caller.id, entity=entity, project=project, name=name)) is not None:
        if existing.base_model != base_model:
            raise BaseModelMismatch(f"model {entity}/{project}/{name} exists with base_model {existing.base_model!r}")
        return Registered(existing, created=False)
    if (refusal := allowed_base_model(base_model, caller=caller, settings=settings)) is not None:
        raise NotAllowed(refusal)
    environment = project if project in environments.available() else ENVIRONMENT
    try:
        spec = JobSpec(environment=environment, validation=validation or ValidationSpec(),
                       model=ModelSpec(name=name, base_model=base_model, backend="transformers"))  # fmt: skip
    except ValidationError as exc:
        error = exc.errors()[0]
        raise InvalidModel(f"{'.'.join(map(str, error['loc'])) or 'base_model'}: {error['msg']}") from None
    now = utcnow()
    job = Job(id=str(uuid.uuid4()), kind=JobKind.training, status=JobStatus.running, environment=environment,
              spec=spec.model_dump(mode="json"), owner_id=caller.id, started_at=now, created_at=now)  # fmt: skip
    model = ClientModel(id=str(uuid.uuid4()), owner_id=caller.id, entity=entity, project=project, name=name,
                        base_model=base_model, job_id=job.id, created_at=now)  # fmt: skip
    session.add(job)
    session.flush()  # the job before the row that points at it
    session.add(model)
    append_event(session, job_id=job.id, kind="started", data={"client_model": model.id})
    try:
        session.commit()
    except IntegrityError:  # the same name registered concurrently: theirs stands
        session.rollback()
        if (existing := find(session, owner_id=caller.id, entity=entity, project=project, name=name)) is None:
            raise
        return Registered(existing, created=False)
    return Registered(model, created=True)


def find(session: Session, *, owner_id: str, entity: str, project: str, name: str) -> ClientModel | None:
    query = select(ClientModel).where(col(ClientModel.owner_id) == owner_id, col(ClientModel.entity) == entity,
                                      col(ClientModel.project) == project, col(ClientModel.name) == name)  # fmt: skip
    return session.exec(query).first()


def visible(session: Session, *, caller: Principal, model_id: str) -> ClientModel | None:
    """The model if it is the caller's (an operator's too: they see every tenant's); None otherwise, as for a
    missing one."""
    model = session.get(ClientModel, model_id) if len(model_id) <= 36 else None
    if model is None or not (caller.is_operator or model.owner_id == caller.id):
        return None
    return model


def series_job(session: Session, model: ClientModel) -> Job:
    job = runs.get_job(session, job_id=model.job_id)
    assert job is not None  # a foreign key
    return job


def model_dir(job: Job, data_dir: Path) -> Path:
    """Where the series job's checkpoints live (ART's layout, as for any job)."""
    return checkpoints.model_dir(job, data_dir)


def checkpoint_steps(session: Session, model: ClientModel, data_dir: Path) -> list[int]:
    """Steps with a checkpoint on disk that the store recorded (a checkpoint a crashed batch wrote past the record is
    not one), oldest first."""
    job = series_job(session, model)
    return [step for step in layout.checkpoint_steps(model_dir(job, data_dir)) if step <= model.step]


def step_metrics(session: Session, model: ClientModel, steps: list[int]) -> dict[int, dict[str, float]]:
    """What each recorded step measured, as ART's checkpoint list carries it (flat floats)."""
    if not steps:
        return {}
    rows = session.exec(select(TrainingStep).where(col(TrainingStep.job_id) == model.job_id,
                                                   col(TrainingStep.step).in_(steps))).all()  # fmt: skip
    found: dict[int, dict[str, float]] = {}
    for row in rows:
        values = {"reward": row.reward_mean, "reward_std": row.reward_std, "loss": row.loss, "entropy": row.entropy,
                  "kl_div": row.kl, "grad_norm": row.grad_norm}  # fmt: skip
        found[row.step] = {key: float(value) for key, value in values.items() if value is not None}
    return found
