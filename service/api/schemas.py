"""API schemas: what the HTTP API returns, named per resource (``JobPublic`` for the ``Job`` table), and the
chat completion request of a trained checkpoint with its bounds (``ChatCompletionCreate``).

They are read from the SQL rows (``from_attributes``) and list exactly the fields clients are
promised; internal columns (owner, lease, request hash) never leave the service.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.backends.openai_server import ChatCompletionRequest
from service.store.records import JudgeAccount
from service.store.tables import JobStatus, StopReason

MAX_COMPLETIONS = 8  # n
MAX_MESSAGES = 256
MAX_TOOLS = 32
MAX_STOP = 4  # stop strings, as OpenAI allows
MAX_STOP_CHARS = 256


class PublicModel(BaseModel):
    model_config = ConfigDict(from_attributes=True, ser_json_inf_nan="null")


class JobPublic(PublicModel):
    id: str
    status: JobStatus
    environment: str
    spec: dict[str, Any] = Field(description="The JobSpec as submitted, with every default filled in.")
    step: int = Field(description="The last training step recorded.")
    base_val_accuracy: float | None = Field(
        None, description="The base model's validation accuracy before the warm start (a job with one)."
    )
    step0_val_accuracy: float | None = Field(description="Validation accuracy before RL, after any warm start.")
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
    tokens_generated: int | None = Field(None, description="Tokens the policy generated (sampled and greedy passes).")
    created_at: datetime


class JudgeTotals(JudgeAccount):
    """What a judged job's judge calls have cost so far, summed over its steps."""


class PhaseSeconds(BaseModel):
    rollout: float = Field(description="Gathering rollouts, less the time a judge call was in flight.")
    judge: float = Field(description="Time with at least one judge call in flight.")
    train: float
    validation: float = Field(description="Validation, sampled and greedy passes.")


class CostPublic(BaseModel):
    """What a job has spent: the numbers an operator weighs a run's gain against."""

    tokens_generated_train: int = Field(description="Tokens the policy generated in training rollouts.")
    tokens_generated_validation: int = Field(description="Tokens the policy generated in validation (both passes).")
    judge_prompt_tokens: int
    judge_completion_tokens: int
    judge_cost_usd: float
    wall_s: PhaseSeconds = Field(description="Wall time per phase, summed over steps and validation points.")


class MetricsPublic(BaseModel):
    steps: list[StepPublic] = Field(description="Every training step, in order.")
    validation: list[ValidationPublic] = Field(
        description="Every validation point, step 0 (the baseline) first. In ruler mode (no ground truth) a point's "
        "accuracy is the mean RULER reward of the steps since the previous point."
    )
    judge: JudgeTotals | None = Field(None, description="Judge calls, tokens and cost; null for jobs scored by a verifier.")
    cost: CostPublic | None = Field(None, description="Tokens generated, judge spend and wall time per phase.")


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


class CheckpointPublic(BaseModel):
    step: int
    format: Literal["peft_adapter", "embedded", "other"] = Field(
        description="`peft_adapter`: a PEFT adapter directory (the transformers backend's); `embedded`: a `.pt` file "
        "of the embedded backend's character model; `other`: a directory without adapter_config.json."
    )
    exportable: bool = Field(description="Whether `GET /v1/jobs/{id}/checkpoints/{step}/adapter` serves it.")
    accuracy: float | None = Field(description="Validation accuracy sampled at this step; null if not validated there.")
    greedy_accuracy: float | None = Field(description="Greedy validation accuracy at this step, where recorded.")


class CheckpointList(BaseModel):
    job_id: str
    backend: str
    base_model: str | None = Field(description="The base model the job trains from.")
    best_step: int | None = Field(
        description="The job's best validation step (highest accuracy, earliest on ties): as recorded when it ended, "
        "else the best so far; null before any validation. Training keeps its checkpoint."
    )
    latest_step: int | None = Field(description="The newest checkpoint on disk; null if there is none.")
    data: list[CheckpointPublic] = Field(
        description="Checkpoints on disk, oldest first. Training keeps step 0, the best step and the two newest."
    )


class EvaluationPublic(PublicModel):
    id: str
    status: JobStatus
    environment: str
    spec: dict[str, Any] = Field(description="The EvaluationSpec as submitted, with every default filled in.")
    parent_id: str | None = Field(description="The training job this evaluation measured the baseline of, if any.")
    summary: dict[str, Any] | None = Field(
        description="pass_rate, mean_reward, outcomes, failures (the failure table by outcome code), mean completion "
        "length and tokens, n and pass_at_k (unbiased), and with n > 1 a `selection` label: best-of-N is selection, "
        "not learning."
    )
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class EvaluationList(BaseModel):
    data: list[EvaluationPublic] = Field(description="Evaluations, newest first.")
    next_cursor: str | None


class ExampleResultPublic(PublicModel):
    position: int = Field(description="Order of the scenario in its split.")
    scenario_id: str
    outcome: str = Field(description="The scorer's outcome code.")
    correct: bool
    reward: float
    completion: str = Field(description="The (selected) completion's last turn.")
    completion_tokens: int | None
    samples: int
    correct_samples: int
    details: dict[str, Any] = Field(description="The scorer's details; with n > 1 every candidate's reward.")


class ExampleResultList(BaseModel):
    data: list[ExampleResultPublic]


class OverallDelta(BaseModel):
    baseline: float
    candidate: float
    delta: float
    ci_low: float
    ci_high: float
    candidate_only: int = Field(description="Examples counted on the candidate's side only (correct, or with this "
                                "outcome): with baseline_only, the pairs that moved, which alone carry the delta.")
    baseline_only: int = Field(description="Examples counted on the baseline's side only.")


class OutcomeDelta(OverallDelta):
    outcome: str
    failure: bool = Field(description="Whether the outcome is a failure (it occurs on an example scored incorrect).")
    regressed: bool = Field(description="A failure outcome whose rate rose beyond its interval: the gate rejects.")


class SideOfComparison(BaseModel):
    id: str
    kind: str
    step: int
    examples: int


class ComparisonPublic(BaseModel):
    decision: str = Field(description="ACCEPT or REJECT.")
    comparable: bool = Field(description="Whether the manifests agree on every locked field (the Locked Room rule).")
    reasons: list[str] = Field(description="Why it was rejected: every differing manifest field, or the gate's findings.")
    differences: list[dict[str, Any]] = Field(description="Locked manifest fields that differ, with both values.")
    baseline: SideOfComparison
    candidate: SideOfComparison
    overall: OverallDelta | None = Field(description="Accuracy of each side and the delta, with its bootstrap interval.")
    outcomes: list[OutcomeDelta] = Field(description="The rate of every outcome code on each side, with intervals.")
    min_delta: float
    confidence: float
    resamples: int


StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class ChatCompletionCreate(ChatCompletionRequest):
    """An OpenAI chat completion request on a trained checkpoint, every value bounded (the policy servers' request
    model; max_tokens is bounded by ARTSVC_INFERENCE_MAX_TOKENS in the route, the body by ARTSVC_MAX_BODY_BYTES).
    Other OpenAI parameters are accepted and ignored; ``stream`` sends the completion as server-sent chunks."""

    model: str = Field(
        min_length=1, max_length=256, description="`JOB_ID` (the job's best validation step, else its latest "
        "checkpoint), or `JOB_ID@STEP` with STEP a number, `best` or `latest`; a model ART's client registered: "
        "`wandb-artifact:///ENTITY/PROJECT/NAME` or `...:stepN`; a base model the operator serves, by name.",
    )  # fmt: skip
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_MESSAGES)
    n: int = Field(1, ge=1, le=MAX_COMPLETIONS)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)

    @field_validator("messages")
    @classmethod
    def _text_content(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        texts = []
        for index, message in enumerate(messages):
            try:
                texts.append(text_content(message))
            except ValueError as exc:
                raise ValueError(f"message {index}: {exc}") from None
        return texts


def text_content(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with OpenAI content parts (what the official client sends for multi-part input) as one string,
    text parts joined by newlines as vLLM joins them; ValueError naming any other part type, or content that is
    neither a string, a list of parts nor null."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise ValueError(f"content is a {type(content).__name__}: a string, a list of text parts or null")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(f"content part of type {str(kind)[:40]!r}: only text parts are supported")
        if not isinstance(part.get("text"), str):
            raise ValueError("a text content part's text must be a string")
        texts.append(part["text"])
    return {**message, "content": "\n".join(texts)}


class OpenAIError(BaseModel):
    message: str = Field(description="What is wrong, in one sentence.")
    type: str = Field(description="`invalid_request_error`, or `server_error` for a 5xx.")
    code: str | None = Field(description="A machine-readable reason, e.g. `model_not_found`.")


class OpenAIErrorBody(BaseModel):
    """OpenAI's error envelope, which OpenAI clients read."""

    error: OpenAIError
