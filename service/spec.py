"""The JobSpec: what a client asks to train. Every section is optional with safe defaults,
so ``{"environment": "math"}`` is a complete job."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# The embedded backend's default architecture, named here as a plain string so that importing the spec (the API,
# `artsvc submit`) does not import torch; tests/service/test_spec_defaults.py checks it matches
# service.backends.embedded.policy.DEFAULT_BASE_MODEL.
DEFAULT_BASE_MODEL = "embedded/char-gpt-0.8m"
# The default of every other backend: a real pretrained LM, SmolLM2-135M-Instruct, from its wheel's GGUF file (see
# service/backends/transformers/models.py, which names it too; tests/service/test_spec_defaults.py checks they agree).
DEFAULT_PRETRAINED_MODEL = "SmolLM2-135M-Instruct"
EMBEDDED_PREFIX = "embedded/"  # the embedded backend's architectures are named embedded/...
LITELLM_MODEL_PATTERN = r"^[A-Za-z0-9_.-]+/\S+$"  # provider/model, as litellm names models


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # JSON types as given

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any, info: ValidationInfo) -> Any:
        """No text a client sends may hold NUL: SQLite would store it and PostgreSQL refuse it later (a 500). A
        section's own fields say it of themselves, so the error names the innermost field."""
        if _is_section(cls.model_fields[info.field_name].annotation):
            return value
        if (where := nul_in(value)) is not None:
            raise PydanticCustomError("nul_character", "holds a NUL character (\\x00){where}", {"where": where})
        return value


def _is_section(annotation: Any) -> bool:
    return any(isinstance(a, type) and issubclass(a, _Section) for a in (annotation, *get_args(annotation)))


def nul_in(value: Any) -> str | None:
    """Where a NUL is in a JSON value, keys included: "" in the value itself, " at [...]" inside it; None
    when nowhere. A loop with linked trails, not recursion or copied paths: nesting depth is the client's choice."""
    stack: list[tuple[Any, tuple | None]] = [(value, None)]  # (item, (its key, its parent's trail))
    while stack:
        item, trail = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return _render(trail)
        elif isinstance(item, dict):
            stack.extend((part, (key, trail)) for key, v in item.items() for part in (v, key))
        elif isinstance(item, (list, tuple)):
            stack.extend((part, (i, trail)) for i, part in enumerate(item))
    return None


def _render(trail: tuple | None, limit: int = 8) -> str:
    keys: list[Any] = []
    while trail is not None:
        key, trail = trail
        keys.append(key)
    shown = "".join(f"[{key!r}]" for key in reversed(keys[:limit]))
    return f" at {'...' if len(keys) > limit else ''}{shown}" if keys else ""


Backend = Literal["transformers", "embedded", "local", "serverless"]


class ModelSpec(_Section):
    name: str = Field("demo", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Name of the trained model.")
    base_model: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description=(
            "Base model. For the transformers backend a causal LM it loads offline (a model id in the Hugging Face "
            f"cache, a directory the operator allows, or {DEFAULT_PRETRAINED_MODEL}); unset, the environment's "
            "recommended one. For the embedded backend a named architecture (embedded/...); unset, the environment's "
            f"(its context must hold the environment's conversations), else {DEFAULT_BASE_MODEL}. Required for local "
            "and serverless."
        ),
    )
    backend: Backend = Field(
        "transformers",
        description="Where the policy trains. Unset: embedded when base_model names an embedded architecture, "
        "else transformers (a real LM on this machine's GPU or CPU).",
    )

    @model_validator(mode="before")
    @classmethod
    def _backend_of_the_base_model(cls, data: Any) -> Any:
        """An embedded architecture, named without a backend, trains on the embedded backend."""
        if isinstance(data, dict) and "backend" not in data:
            base_model = data.get("base_model")
            if isinstance(base_model, str) and base_model.startswith(EMBEDDED_PREFIX):
                return {**data, "backend": "embedded"}
        return data


class RewardSpec(_Section):
    """Where training rewards come from. ``verifier``: the environment's own scorer. ``ruler``: RULER judges each
    group and the job stops when the mean RULER reward plateaus. ``hybrid``: RULER rewards for training, the
    environment's ground-truth validation accuracy for stopping (and divergence alerts between the two).
    ``grader``: a grader (judges/graders: string_check, text_similarity, python, score_model, multi) scores each
    final reply against its scenario for training; validation stays the environment's ground truth."""

    mode: Literal["verifier", "ruler", "hybrid", "grader"] = "verifier"
    judge_model: str | None = Field(
        None,
        min_length=3,
        max_length=256,
        pattern=LITELLM_MODEL_PATTERN,
        description="RULER judge (ruler and hybrid modes): a litellm provider/model name the server's operator allows.",
    )
    rubric: str | None = Field(None, min_length=1, max_length=20_000, description="Grading standards for the judge.")
    max_judge_cost_usd: float | None = Field(
        None, gt=0, le=1_000_000, description="Stop the job (stop reason budget) once its judge or grader model calls have cost this much."
    )
    grader: dict[str, Any] | None = Field(
        None,
        examples=[{"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
                   "reference": "Final: {{item.answer}}", "operation": "eq"}],  # fmt: skip
        description="The grader of grader mode, as OpenAI's RFT graders are written (see docs/judges.md).",
    )

    @model_validator(mode="after")
    def _settings_of_the_mode(self) -> RewardSpec:
        judged = self.mode in ("ruler", "hybrid")
        if judged and self.judge_model is None:
            raise ValueError(f"reward.judge_model is required in {self.mode} mode")
        if not judged and (self.judge_model, self.rubric) != (None, None):
            raise ValueError("reward.judge_model and rubric apply to the ruler and hybrid modes only")
        if (self.mode == "grader") != (self.grader is not None):
            raise ValueError("reward.grader is required in grader mode and applies to it only")
        if self.mode == "verifier" and self.max_judge_cost_usd is not None:
            raise ValueError("reward.max_judge_cost_usd applies to the ruler, hybrid and grader modes only")
        if self.grader is not None:  # its shape and size; the operator's settings decide the rest (refuse_reward)
            from judges.graders import GraderConfigError, check_grader  # pydantic models only: no litellm, no torch

            try:
                check_grader(self.grader)
            except GraderConfigError as exc:
                raise ValueError(f"reward.grader: {exc}") from None
        return self


class TrainingSpec(_Section):
    groups_per_step: int = Field(8, gt=0, le=1024, description="Scenarios per training step.")
    group_size: int = Field(8, ge=2, le=256, description="Rollouts per scenario; GRPO needs at least 2.")
    learning_rate: float = Field(
        1e-4, gt=0, lt=1, description="RL learning rate (Adam); 1e-4 suits a LoRA on a ~100M LM and the embedded policy; 7B GPU LoRA runs want less."
    )
    max_steps: int = Field(20, gt=0, le=100_000, description="Training steps at most (the default fits the main job on 2 CPU cores).")
    kl_penalty_coef: float = Field(0.0, ge=0, le=100, description="Weight of the KL penalty to the reference policy.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature of training rollouts.")
    warm_start_examples: int | None = Field(
        None,
        ge=0,
        le=10_000_000,
        description="Demonstrations for the supervised warm start (0 skips it); unset, the environment's recommendation.",
    )
    warm_start_learning_rate: float = Field(1e-3, gt=0, lt=1)


class ValidationSpec(_Section):
    every_n_steps: int = Field(4, gt=0, le=10_000, description="Validate after every this many training steps.")
    patience: int = Field(
        3, gt=0, le=1_000, description="Stop after this many evaluations without a gain of min_delta."
    )
    min_delta: float = Field(0.01, ge=0, le=1)
    target_accuracy: float | None = Field(None, gt=0, le=1, description="Stop once validation reaches this.")
    target_gain: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Stop once validation is this far above the series' first point (step 0: the policy before RL, "
        "after any warm start): a target that holds wherever the warm start lands. With target_accuracy, the lower "
        "of the two stops the job.",
    )
    max_examples: int = Field(
        100, gt=0, le=100_000, description="Validation examples per evaluation (the first N of the split)."
    )
    temperature: float = Field(1.0, ge=0, le=2, description="Sampling temperature of validation (0 = greedy).")
    greedy: bool = Field(
        True,
        description="Also play every example greedily (greedy_accuracy, a diagnostic beside the sampled accuracy the "
        "stopping rules read). An agent's validation is a multi-turn episode per example, and this doubles it.",
    )
    baseline_model: str | None = Field(
        None,
        min_length=3,
        max_length=256,
        pattern=LITELLM_MODEL_PATTERN,
        description="A litellm provider/model the operator allows (ARTSVC_BASELINE_MODELS), evaluated on the "
        "validation examples before training; its accuracy is recorded as an evaluation job of this job.",
    )
    beat_baseline_by: float | None = Field(
        None, ge=0, le=1, description="Stop (stop reason beat_baseline) once validation accuracy reaches the baseline's plus this."
    )

    @model_validator(mode="after")
    def _baseline_to_beat(self) -> ValidationSpec:
        if self.beat_baseline_by is not None and self.baseline_model is None:
            raise ValueError("validation.beat_baseline_by needs validation.baseline_model")
        return self


class AlertSpec(_Section):
    """Thresholds of the alert rules (service/alerts/rules.py) and whether divergence stops the job."""

    stop_on_divergence: bool = Field(False, description="Stop the job (stop reason divergence) when reward hacking is signalled.")
    divergence_window: int = Field(3, ge=2, le=50, description="Evaluations over which validation must fall while reward rises.")
    kl_threshold: float = Field(0.5, gt=0, le=100, description="KL to the reference (nats) past which kl_spike fires.")
    collapse_fraction: float = Field(0.75, gt=0, le=1, description="Share of zero-variance groups in a step that fires collapse.")
    rearm_steps: int = Field(
        5, ge=1, le=100, description="Steps in a row that collapse, kl_spike, judge_failures and judge_disagreement "
        "must stay clear before they fire again: a reading that flickers across its threshold is one condition.",
    )
    reward_jump: float = Field(0.2, gt=0, le=10, description="Rise of mean reward over one step, after a plateau, that fires reward_jump.")
    reward_plateau_steps: int = Field(
        5, ge=2, le=1_000, description="Steps whose mean reward spans under reward_jump / 2 that count as a reward plateau."
    )
    judge_failure_rate: float = Field(
        0.2, gt=0, le=1, description="Share of a job's groups the judge could not score that fires judge_failures."
    )
    judge_agreement: float = Field(
        0.0, ge=-1, le=1, description="Mean rank correlation of RULER scores with independent rewards under which judge_disagreement fires."
    )
    judge_agreement_window: int = Field(3, ge=1, le=100, description="Steps the judge_agreement mean is taken over.")


class JobSpec(_Section):
    environment: str = Field(
        min_length=1, max_length=64, examples=["math"], description="An installed environment (GET /v1/environments)."
    )
    environment_args: dict[str, StrictBool | StrictInt | StrictFloat | StrictStr] = Field(
        default_factory=dict,
        max_length=32,
        examples=[{"target_tile": 64}],
        description="Keyword arguments of the environment (GET /v1/environments lists what each takes).",
    )
    model: ModelSpec = ModelSpec()
    reward: RewardSpec = RewardSpec()
    training: TrainingSpec = TrainingSpec()
    validation: ValidationSpec = ValidationSpec()
    alerts: AlertSpec = AlertSpec()
    seed: int = Field(0, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _base_model_for_gpu_backends(self) -> JobSpec:
        if self.model.backend in ("local", "serverless") and self.model.base_model is None:
            raise ValueError(f"model.base_model is required for the {self.model.backend} backend (a Hugging Face model id)")
        base_model = self.model.base_model or ""
        if (self.model.backend == "embedded") != base_model.startswith(EMBEDDED_PREFIX) and self.model.base_model is not None:
            raise ValueError(f"model.base_model: {base_model!r} is {'not ' if self.model.backend == 'embedded' else ''}an "
                             f"embedded architecture; those (and only those) train on the embedded backend")  # fmt: skip
        if self.reward.mode == "ruler" and self.validation.baseline_model is not None:
            raise ValueError("validation.baseline_model needs ground-truth validation; ruler mode has none (use hybrid)")
        for key, value in self.environment_args.items():
            if len(key) > 64 or (isinstance(value, str) and len(value) > 1024):
                raise ValueError(f"environment_args: {key[:64]!r} is too long (keys up to 64, strings up to 1024 characters)")
        return self


class CheckpointModel(_Section):
    """A training job's policy at one of its kept checkpoints."""

    job_id: str = Field(min_length=1, max_length=36, description="The training job (it must have ended).")
    step: int | None = Field(None, ge=0, le=2**31 - 1, description="Its checkpoint; unset, the job's best step.")


class LitellmModel(_Section):
    """Any chat model litellm names, served OpenAI-style at the operator's endpoint (a baseline)."""

    litellm: str = Field(min_length=3, max_length=256, pattern=LITELLM_MODEL_PATTERN,
                         description="A provider/model the operator allows (ARTSVC_BASELINE_MODELS).")  # fmt: skip


class EvaluationSpec(_Section):
    """Measurement only: one model on one split, nothing trained. With ``n`` > 1, best-of-N selection."""

    model: CheckpointModel | LitellmModel
    environment: str | None = Field(
        None, min_length=1, max_length=64, description="Unset for a checkpoint: the job's environment (required for litellm)."
    )
    environment_args: dict[str, StrictBool | StrictInt | StrictFloat | StrictStr] | None = Field(
        None, max_length=32, description="Unset for a checkpoint: the job's."
    )
    split: Literal["train", "val", "test"] = "val"
    max_examples: int = Field(200, gt=0, le=100_000, description="The first N scenarios of the split.")
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature; unset, the job's validation temperature (1.0 for litellm)."
    )
    n: int = Field(1, ge=1, le=64, description="Completions per example; above 1, the best by reward is selected.")
    ks: list[StrictInt] | None = Field(
        None, max_length=16, description="pass@k reported for each k (1..n); unset, 1 and n."
    )
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="Unset for a checkpoint: the job's seed (0 for litellm).")

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationSpec:
        if isinstance(self.model, LitellmModel) and self.environment is None:
            raise ValueError("environment is required to evaluate a litellm model")
        if self.ks is not None and any(k < 1 or k > self.n for k in self.ks):
            raise ValueError(f"every k in ks must be between 1 and n={self.n}")
        return self
