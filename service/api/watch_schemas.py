"""API schemas of what operators watch: a job's events, alerts, installed environments, service health.

Read from the SQL rows (``from_attributes``) like the job schemas in :mod:`service.api.schemas`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.api.schemas import PublicModel

from service.store.tables import AlertState

MAX_ID = 2**31 - 1  # event and alert ids are 32-bit integers


class EventPublic(PublicModel):
    id: int = Field(description="Orders the log; pass as `after` (or `Last-Event-ID`) to read on from here.")
    job_id: str
    kind: str = Field(
        description="queued, started, resumed, cancel_requested, step, validation, alert, alert_acknowledged, finished"
    )
    step: int | None = Field(description="The training step the event belongs to, if any.")
    data: dict[str, Any] = Field(description="What happened: the step's metrics, the validation point, the alert...")
    created_at: datetime


class EventList(BaseModel):
    data: list[EventPublic] = Field(description="Events, oldest first.")
    next_cursor: int | None = Field(description="Pass as `after` for the next page; null when this page is the last.")


class AlertPublic(PublicModel):
    id: int
    job_id: str
    kind: str = Field(description="plateau, divergence, reward_jump, collapse or kl_spike")
    step: int = Field(description="The step whose recorded numbers fired it.")
    message: str
    evidence: dict[str, Any] = Field(description="The numbers that fired the rule.")
    state: AlertState
    webhook_status: str | None = Field(description="pending, delivered or failed; null without a webhook.")
    created_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str | None = Field(description="Id of the operator token that acknowledged it.")


class AlertList(BaseModel):
    data: list[AlertPublic] = Field(description="Alerts, newest first.")
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page; null when this page is the last.")


class SplitPublic(BaseModel):
    size: int = Field(description="Scenarios in the split.")
    fingerprint: str = Field(description="sha256 of the split's canonical scenario data.")


class EnvironmentPublic(BaseModel):
    name: str
    version: str | None = None
    scorer_name: str | None = None
    scorer_version: str | None = None
    splits: dict[str, SplitPublic] = Field(default_factory=dict, description="train, val, test... by name.")
    data_fingerprints: dict[str, str] = Field(
        default_factory=dict, description="Fingerprints of other data its rollouts read (e.g. a corpus), by name."
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="What a job's environment_args may set, with the defaults (null: required)."
    )
    tools: list[str] = Field(default_factory=list, description="Names of the tools its rollouts offer the policy.")
    warm_start_examples: int | None = Field(
        None, description="Demonstrations a policy trained from scratch (the embedded backend) gets unless the job "
        "says otherwise."
    )
    pretrained_warm_start_examples: int | None = Field(
        None, description="Demonstrations a pretrained model (the transformers backend) gets unless the job says "
        "otherwise."
    )
    pretrained_job: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Training and validation settings a job on the transformers backend gets "
        "where it leaves them unset (smaller steps and validations for an agent whose turns are model calls)."
    )
    error: str | None = Field(None, description="Why the environment could not be loaded (the rest is then empty).")


class DatabaseHealth(BaseModel):
    ok: bool
    error: str | None = None


class WorkersHealth(BaseModel):
    alive: int = Field(description="Workers that heartbeated within two lease periods and have not stopped.")
    capacity: int = Field(description="Jobs the live workers can train at once.")
    running_jobs: int = Field(description="Jobs the live workers say they are training.")


class HealthPublic(BaseModel):
    status: Literal["ok", "degraded", "unavailable"] = Field(
        description="ok; degraded: no live worker picks up jobs; unavailable: the database cannot be reached."
    )
    database: DatabaseHealth
    workers: WorkersHealth | None = Field(description="Null when the database cannot be reached.")
