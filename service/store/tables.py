"""SQL tables (SQLModel). Alembic migrations under ``migrations/`` are the only author of the schema."""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Column, DateTime, UniqueConstraint
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


class Job(SQLModel, table=True):
    __tablename__ = "jobs"

    id: str = Field(primary_key=True, max_length=36)
    status: JobStatus = Field(default=JobStatus.queued, index=True)
    environment: str = Field(max_length=128)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    step: int = 0
    step0_val_accuracy: float | None = None
    best_val_accuracy: float | None = None
    best_step: int | None = None
    stop_reason: StopReason | None = None
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    started_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    finished_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))


class TrainingStep(SQLModel, table=True):
    """One row per training step of a job."""

    __tablename__ = "training_steps"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    step: int
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
    metrics: dict[str, float] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class ValidationPoint(SQLModel, table=True):
    """Validation accuracy of a job's policy at one step, with its outcome breakdown."""

    __tablename__ = "validation_points"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=36)
    step: int
    accuracy: float
    greedy_accuracy: float | None = None
    examples: int
    temperature: float
    outcomes: dict[str, int] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    wall_time_s: float
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
