"""What one tenant may ask of this server, as the operator set it (service/settings.py, "Tenants").

A client token may name only the backends in ``client_backends`` and, beyond the environment's recommended base
model, only those in ``client_base_models`` (``*``: any), and may have ``tenant_max_queued_jobs`` jobs and
evaluations waiting at most. Operator tokens, and the local single-user mode, choose backends, base models and how
much to queue themselves: spending the operator's resources is the operator's decision. Every token, an operator's
too, is held to the per-job limits (``max_steps_per_job``, ``max_rollouts_per_job``) and the per-phase ones
(``max_rollouts_per_step``, ``max_warm_start_examples``, ``max_validation_examples``), which guard the workers against
a slip as much as against a tenant; ``artsvc train`` submits as the local operator and is held to them too
(service/submission.py makes every check). How many jobs of a tenant run at once, and in what order tenants are
served, is the workers' side (service/worker/leases.py).
"""

from __future__ import annotations

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from environments import Environment
from service.auth import Principal
from service.manifests import recommended_base_model, warm_start_examples
from service.settings import Settings
from service.spec import JobSpec
from service.store.tables import ApiToken, Job, JobStatus

RETRY_LATER = {"Retry-After": "60"}  # the headers of a full queue's 429: queued jobs start on the scale of minutes


def refuse_job(spec: JobSpec, env: Environment, *, caller: Principal, settings: Settings) -> str | None:
    """Why this server will not run ``spec`` for ``caller``, naming the field, the limit and its setting (a 422);
    None if it may."""
    steps, rollouts = spec.training.max_steps, _rollouts(spec)
    if steps > settings.max_steps_per_job:
        return (f"training.max_steps: {steps} is over this server's limit of {settings.max_steps_per_job} steps "
                "per job (ARTSVC_MAX_STEPS_PER_JOB)")  # fmt: skip
    if rollouts > settings.max_rollouts_per_job:
        return (f"training: max_steps x groups_per_step x group_size is {rollouts} rollouts, over this server's "
                f"limit of {settings.max_rollouts_per_job} per job (ARTSVC_MAX_ROLLOUTS_PER_JOB)")  # fmt: skip
    if (refusal := _refuse_phase_sizes(spec, env, settings)) is not None:
        return refusal
    if caller.is_operator:
        return None
    if (backend := spec.model.backend) not in settings.client_backends:
        allowed = ", ".join(settings.client_backends) or "none"
        return (f"model.backend: {backend!r} is not a backend this server lets client tokens use; allowed: "
                f"{allowed} (the operator sets ARTSVC_CLIENT_BACKENDS)")  # fmt: skip
    base_model, recommended, listed = spec.model.base_model, recommended_base_model(env, spec.model.backend), settings.client_base_models
    if base_model in (None, recommended) or base_model in listed or "*" in listed:
        return None
    return (f"model.base_model: {base_model!r} is not a base model this server lets client tokens use; allowed: "
            f"{', '.join([recommended, *listed])} (the operator sets ARTSVC_CLIENT_BASE_MODELS)")  # fmt: skip


def _refuse_phase_sizes(spec: JobSpec, env: Environment, settings: Settings) -> str | None:
    """Why one phase of ``spec`` is too large for this server (a step's rollouts, the warm start's demonstrations, a
    validation's examples): each runs as one piece of work on a worker, so each is bounded on its own, not only the
    job's total."""
    per_step, limit = spec.training.groups_per_step * spec.training.group_size, settings.max_rollouts_per_step
    if per_step > limit:
        return (f"training: groups_per_step x group_size is {per_step} rollouts per step, over this server's limit "
                f"of {limit} (ARTSVC_MAX_ROLLOUTS_PER_STEP)")  # fmt: skip
    examples, limit = warm_start_examples(spec, env), settings.max_warm_start_examples
    if examples > limit:
        asked = examples if spec.training.warm_start_examples is not None else f"unset, the environment's {examples},"
        return (f"training.warm_start_examples: {asked} is over this server's limit of {limit} demonstrations per "
                "warm start (ARTSVC_MAX_WARM_START_EXAMPLES)")  # fmt: skip
    examples, limit = spec.validation.max_examples, settings.max_validation_examples
    if examples > limit:
        return (f"validation.max_examples: {examples} is over this server's limit of {limit} examples per validation "
                "(ARTSVC_MAX_VALIDATION_EXAMPLES)")  # fmt: skip
    return None


def _rollouts(spec: JobSpec) -> int:
    training = spec.training
    return training.max_steps * training.groups_per_step * training.group_size


def hold_queue(session: Session, *, caller: Principal) -> None:
    """Serialize ``caller``'s submissions until this transaction ends, so that counting its queue and adding to it
    happen as one step even when a client sends in parallel: a write to its token's row takes the row's lock on
    PostgreSQL and the database's write lock on SQLite. Operators have no queue limit and are not held."""
    if not caller.is_operator:
        session.exec(update(ApiToken).where(col(ApiToken.id) == caller.id).values(name=ApiToken.name))


def refuse_queue(session: Session, *, caller: Principal, settings: Settings) -> str | None:
    """Why ``caller`` may not queue another job or evaluation now (a 429 with RETRY_LATER); None if it may. Call it
    after ``hold_queue``, in the transaction that adds the job."""
    if caller.is_operator:
        return None
    mine = col(Job.owner_id) == caller.id, col(Job.status) == JobStatus.queued
    queued = session.exec(select(func.count()).select_from(Job).where(*mine)).one()
    limit = settings.tenant_max_queued_jobs
    if queued < limit:
        return None
    return (f"tenant_max_queued_jobs: this token has {queued} jobs and evaluations queued, the limit of this server "
            f"(ARTSVC_TENANT_MAX_QUEUED_JOBS={limit}); submit again once some have started or cancel some")  # fmt: skip
