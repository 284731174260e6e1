"""API schemas: what the HTTP API returns, named per resource (``JobPublic`` for the ``Job`` table).

They are read from the SQL rows (``from_attributes``) and list exactly the fields clients are
promised (DESIGN.md); internal columns (owner, lease, request hash) never leave the service.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.store.tables import JobStatus, StopReason


class PublicModel(BaseModel):
    model_config = ConfigDict(from_attributes=True, ser_json_inf_nan="null")


class JobPublic(PublicModel):
    id: str
    status: JobStatus
    environment: str
    spec: dict[str, Any] = Field(description="The JobSpec as submitted, with every default filled in.")
    step: int = Field(description="The last training step recorded.")
    step0_val_accuracy: float | None = Field(description="Validation accuracy before training (the baseline).")
    best_val_accuracy: float | None
    best_step: int | None
    stop_reason: StopReason | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool = Field(description="A cancel was asked for; a running job stops at the next step boundary.")


class JobList(BaseModel):
    data: list[JobPublic] = Field(description="Jobs, newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class StepPublic(PublicModel):
    step: int
    reward_mean: float
    reward_std: float
    groups: int
    zero_variance_groups: int = Field(description="Groups whose rollouts all got the same reward (no learning signal).")
    loss: float | None
    entropy: float | None
    kl: float | None = Field(description="KL divergence to the reference policy, in nats.")
    grad_norm: float | None
    clip_fraction: float | None
    completion_length: float
    wall_time_s: float
    metrics: dict[str, float | None] = Field(description="Every other number the backend reported for the step.")
    created_at: datetime


class ValidationPublic(PublicModel):
    step: int
    accuracy: float = Field(description="Share of validation examples solved when sampling at `temperature`.")
    greedy_accuracy: float | None
    examples: int
    temperature: float
    outcomes: dict[str, int] = Field(description="How many examples ended in each scorer outcome.")
    wall_time_s: float
    created_at: datetime


class JudgeTotals(BaseModel):
    """What a judged job's judge calls have cost so far, summed over its steps."""

    judge_responses: float = Field(description="Judge responses received (retried calls count each time).")
    judge_prompt_tokens: float
    judge_completion_tokens: float
    judge_cost_usd: float = Field(description="From litellm's price map; responses of unpriced models add nothing.")
    judge_unpriced: float = Field(description="Responses whose model litellm has no price for.")
    judge_groups: float = Field(description="Groups given to the judge.")
    judge_dropped_groups: float = Field(description="Groups the judge could not score after retries (left out of training).")
    judge_attempts: float
    judge_clamped_scores: float = Field(description="Scores outside [0, 1] that were clamped.")


class MetricsPublic(BaseModel):
    steps: list[StepPublic] = Field(description="Every training step, in order.")
    validation: list[ValidationPublic] = Field(
        description="Every validation point, step 0 (the baseline) first. In ruler mode (no ground truth) a point's "
        "accuracy is the mean RULER reward of the steps since the previous point."
    )
    judge: JudgeTotals | None = Field(None, description="Judge calls, tokens and cost; null for jobs scored by a verifier.")


class TrajectoryPublic(PublicModel):
    id: int
    step: int
    split: str = Field(description="train or val")
    group_index: int
    scenario_id: str | None
    reward: float
    messages: list[dict[str, Any]] = Field(description="The conversation, OpenAI chat format.")
    details: dict[str, Any] = Field(description="The scorer's explanation of the reward.")
    created_at: datetime


class TrajectoryList(BaseModel):
    data: list[TrajectoryPublic] = Field(description="Sampled rollouts, newest step first.")
