"""What an evaluation measures, resolved before it runs: the API checks it at submission (without importing the
backends) and the worker resolves it again when it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

import environments
from environments.base import Environment
from service import manifests
from service.settings import Settings
from service.spec import CheckpointModel, EvaluationSpec, JobSpec
from service.store import runs
from service.store.tables import JobKind, JobStatus


class EvaluationError(ValueError):
    """The evaluation cannot run as asked (an unknown or running job, a checkpoint not kept, a model not allowed)."""


@dataclass
class Resolved:
    """What an evaluation measures, with every default filled in from the evaluated job or the spec."""

    env: Environment
    environment_args: dict[str, Any]
    temperature: float
    seed: int
    model_section: dict[str, Any]


def resolve(session: Session, spec: EvaluationSpec, settings: Settings) -> Resolved:
    """Fill the spec's defaults and check it can run; raises EvaluationError (the API answers 422 or 409)."""
    if isinstance(spec.model, CheckpointModel):
        job = runs.get_job(session, job_id=spec.model.job_id)
        if job is None or job.kind != JobKind.training:
            raise EvaluationError(f"model.job_id: no training job {spec.model.job_id!r}")
        if job.status in (JobStatus.queued, JobStatus.running):
            raise EvaluationError(f"model.job_id: job {job.id} is {job.status.value}; evaluate its checkpoints once it has ended")
        job_spec = JobSpec.model_validate(job.spec)
        step = spec.model.step if spec.model.step is not None else (job.best_step if job.best_step is not None else job.step)
        name = spec.environment or job_spec.environment
        args = spec.environment_args if spec.environment_args is not None else job_spec.environment_args
        temperature = spec.temperature if spec.temperature is not None else job_spec.validation.temperature
        seed = spec.seed if spec.seed is not None else job_spec.seed
        section = {"kind": "checkpoint", "job_id": job.id, "step": step, "backend": job_spec.model.backend,
                   "base_model": (job.manifest or {}).get("model", {}).get("base_model", job_spec.model.base_model)}  # fmt: skip
    else:
        if (refusal := settings.refuse_baseline(spec.model.litellm, field="model.litellm")) is not None:
            raise EvaluationError(refusal)
        assert spec.environment is not None  # the spec requires it for litellm models
        name, args = spec.environment, spec.environment_args or {}
        temperature = spec.temperature if spec.temperature is not None else 1.0
        seed = spec.seed if spec.seed is not None else 0
        section = {"kind": "litellm", "model": spec.model.litellm}
    try:
        env = environments.load(name, args)
    except (environments.UnknownEnvironmentError, environments.EnvironmentConfigError) as exc:
        raise EvaluationError(f"environment: {exc}") from None
    return Resolved(env, dict(args), temperature, seed, section)


def manifest_for(spec: EvaluationSpec, resolved: Resolved) -> dict[str, Any]:
    locked = manifests.measurement(resolved.env, environment_args=resolved.environment_args, split=spec.split,
                                   max_examples=spec.max_examples, temperature=resolved.temperature, samples=spec.n,
                                   metric="accuracy")  # fmt: skip
    return manifests.build(kind="evaluation", env=resolved.env, environment_args=resolved.environment_args,
                           locked=locked, model=resolved.model_section, seed=resolved.seed)  # fmt: skip
