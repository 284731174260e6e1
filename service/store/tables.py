"""SQL tables (SQLModel). Alembic migrations under ``service/store/migrations/`` are the only author of the schema."""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, String, Text, UniqueConstraint, text
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every database (SQLite stores them without the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:  # noqa: ANN001
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class JobStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class StopReason(str, Enum):
    plateau = "plateau"
    target = "target"
    max_steps = "max_steps"
    divergence = "divergence"
    cancelled = "cancelled"
    error = "error"
    budget = "budget"  # the job's judge calls reached reward.max_judge_cost_usd
    beat_baseline = "beat_baseline"  # validation accuracy beat the baseline model's by validation.beat_baseline_by


class JobKind(str, Enum):
    training = "training"
    evaluation = "evaluation"  # measurement only: a model on a split, nothing trained
    client_batch = "client_batch"  # one training step on trajectory groups an ART client posted for its model


class Role(str, Enum):
    client = "client"  # submits jobs, sees only its own
    operator = "operator"  # sees and cancels every job, acknowledges alerts


LOCAL_OWNER = "local"  # owner of jobs made by `artsvc train` and by the local single-user mode


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_owner_created", "owner_id", "created_at"),
        Index("ix_jobs_status_created", "status", "created_at"),
        Index("ix_jobs_kind_created", "kind", "created_at"),
        Index("ix_jobs_parent_id", "parent_id"),  # a client model's batches, a training job's evaluations
    )

    id: str = Field(primary_key=True, max_length=36)
    kind: JobKind = Field(default=JobKind.training, sa_column=Column(String(16), nullable=False, server_default="training"))
    status: JobStatus = Field(default=JobStatus.queued, index=True)
    environment: str = Field(max_length=128)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    parent_id: str | None = Field(
        default=None, foreign_key="jobs.id", max_length=36, description="The training job a baseline evaluation was made for."
    )
    manifest: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON), description="What the run measured with (service/manifests.py)."
    )
    summary: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON), description="An evaluation's results.")
    owner_id: str = Field(default=LOCAL_OWNER, max_length=36, description="Id of the API token that submitted it.")
    idempotency_key: str | None = Field(default=None, max_length=255)
    request_hash: str | None = Field(default=None, max_length=64, description="sha256 of the submitted spec.")
    cancel_requested: bool = False
    worker_id: str | None = Field(default=None, max_length=64, description="The worker holding the lease.")
    lease_expires_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    attempts: int = Field(default=0, description="Claims of the job by workers, less those released at shutdown.")
    step: int = 0
    base_val_accuracy: float | None = None  # the base model before the warm start (a job with one)
    step0_val_accuracy: float | None = None
    best_val_accuracy: float | None = None
    best_step: int | None = None
    stop_reason: StopReason | None = None
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    started_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    finished_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))


JUDGED = text("judge_agreement IS NOT NULL")


class StepBase(SQLModel):
    """A training step's own numbers: what the loop records (service/store/records.py's StepCreate) and the
    ``TrainingStep`` table stores."""

    reward_mean: float
    reward_std: float
    groups: int
    zero_variance_groups: int
    loss: float | None = None
    entropy: float | None = None
    kl: float | None = None
    grad_norm: float | None = None
    clip_fraction: float | None = None
    completion_length: float
    wall_time_s: float


class TrainingStep(StepBase, table=True):
    """One row per training step of a job, with the job's running totals up to it (so a step costs the same
    at step 5 as at step 5,000: service/store/running.py)."""

    __tablename__ = "training_steps"
    __table_args__ = (
        UniqueConstraint("job_id", "step"),
        # the judged steps, newest first, without reading the others (the judge_disagreement rule's window)
        Index("ix_training_steps_judged", "job_id", "step", sqlite_where=JUDGED, postgresql_where=JUDGED),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    step: int
    metrics: dict[str, float] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False), description="StepMetrics as stored: one flat object."
    )
    judge_agreement: float | None = Field(default=None, description="The StepJudge's agreement, where a judge ranked.")
    totals: dict[str, float] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False), description="Sums over the job's steps up to this one."
    )
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class ValidationBase(SQLModel):
    """A validation point's values: what the loop records (service/store/records.py's ValidationCreate) and the
    ``ValidationPoint`` table stores."""

    accuracy: float
    greedy_accuracy: float | None = None
    examples: int
    temperature: float
    outcomes: dict[str, int] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    wall_time_s: float
    tokens_generated: int | None = Field(default=None, description="Tokens the policy generated, sampled and greedy passes.")


BASE_STEP = -1  # the step of the base model's validation point: measured before the warm start; step 0 comes after it


class ValidationPoint(ValidationBase, table=True):
    """Validation accuracy of a job's policy at one step, with its outcome breakdown. A job with a warm start also
    has a point at BASE_STEP, the base model before it; the stopping rules' series starts at step 0 without it."""

    __tablename__ = "validation_points"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    step: int
    # the stopping rules' fold of the series up to this point (service/store/progress.py's Progress)
    best_step: int
    best_accuracy: float
    anchor_accuracy: float
    evaluations_without_gain: int
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class ExampleResult(SQLModel, table=True):
    """How one scenario fared in one measurement: a training job's validation point at ``step``, or an
    evaluation (step 0). What ``GET /v1/compare`` pairs by scenario to bootstrap its intervals."""

    __tablename__ = "example_results"
    __table_args__ = (UniqueConstraint("job_id", "step", "scenario_id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    step: int
    position: int = Field(description="Order of the scenario in its split.")
    scenario_id: str = Field(max_length=128)
    outcome: str = Field(max_length=64)
    correct: bool
    reward: float
    completion: str = Field(default="", sa_column=Column(Text, nullable=False))
    completion_tokens: int | None = None
    samples: int = Field(default=1, description="Completions sampled (best-of-N); the row shows the selected one.")
    correct_samples: int = Field(default=0, description="How many of them were correct (pass@k's c).")
    details: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class JobEvent(SQLModel, table=True):
    """An append-only log of what happened to a job; ``id`` orders it and is the stream cursor."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=36)
    kind: str = Field(max_length=32, description="queued, started, resumed, cancel_requested, step, validation, alert, alert_acknowledged, finished")
    step: int | None = None
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class AlertState(str, Enum):
    open = "open"
    acknowledged = "acknowledged"


class Alert(SQLModel, table=True):
    """An alert rule that fired on a job's recorded series, once, with the numbers that fired it."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("job_id", "kind", "step"), Index("ix_alerts_state_created", "state", "created_at"))

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    kind: str = Field(max_length=32, description="plateau, divergence, reward_jump, collapse, kl_spike")
    step: int
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    state: AlertState = Field(default=AlertState.open)
    webhook_status: str | None = Field(default=None, max_length=16, description="pending, delivered or failed")
    webhook_attempts: int = 0
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    acknowledged_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    acknowledged_by: str | None = Field(default=None, max_length=36)


class SampledTrajectory(SQLModel, table=True):
    """A rollout kept for operators to read: the conversation, its reward and the scorer's details."""

    __tablename__ = "trajectories"
    __table_args__ = (Index("ix_trajectories_job_step", "job_id", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=36)
    step: int
    split: str = Field(max_length=8, description="train or val")
    group_index: int
    scenario_id: str | None = Field(default=None, max_length=128)
    reward: float
    messages: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    details: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class ApiToken(SQLModel, table=True):
    """A bearer token; only its sha256 is stored."""

    __tablename__ = "api_tokens"

    id: str = Field(primary_key=True, max_length=36)
    name: str = Field(max_length=128)
    role: Role
    token_hash: str = Field(max_length=64, unique=True)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    revoked_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    last_used_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))  # to the minute: token_use.py


class BrowserSession(SQLModel, table=True):
    """A dashboard login: the browser holds a random secret (only its sha256 is stored) that stands for an API
    token until it expires, is logged out, or the token is revoked. The token itself never reaches the browser."""

    __tablename__ = "browser_sessions"

    id: str = Field(primary_key=True, max_length=36)
    secret_hash: str = Field(max_length=64, unique=True)
    token_id: str = Field(foreign_key="api_tokens.id", index=True, max_length=36)
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    expires_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    revoked_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))


class ClientModel(SQLModel, table=True):
    """A model that ART's own client (``art.ServerlessBackend``) registered: its name as the client knows it, and the
    training job that holds its series (running, never leased, so never claimed), whose steps each batch the client
    posts (a client_batch job, its ``parent_id`` that job) adds."""

    __tablename__ = "client_models"
    __table_args__ = (UniqueConstraint("owner_id", "entity", "project", "name"),)

    id: str = Field(primary_key=True, max_length=36)
    owner_id: str = Field(max_length=36, description="Id of the API token that registered it.")
    entity: str = Field(max_length=64)
    project: str = Field(max_length=64)
    name: str = Field(max_length=64)
    base_model: str = Field(max_length=255)
    job_id: str = Field(foreign_key="jobs.id", max_length=36, description="The training job holding its series.")
    step: int = Field(default=0, description="The newest step whose checkpoint and record are both written.")
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class WorkerRecord(SQLModel, table=True):
    """A worker process, so /healthz can tell whether anything is picking up jobs."""

    __tablename__ = "workers"

    id: str = Field(primary_key=True, max_length=64)
    hostname: str = Field(max_length=255)
    pid: int
    concurrency: int
    running_jobs: int = 0
    started_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    heartbeat_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    stopped_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
