"""Typed records of a training run, one definition each, for the side that writes them (the training loop, the
judge's account in service/training/judging.py) and the sides that read them (the store, the alert rules, the API):
a step (:class:`StepCreate`), a validation point (:class:`ValidationCreate`), and the parts of a step's ``metrics``
column: its cost, wall time per phase included (:class:`StepCost`), and its judge account (:class:`StepJudge`).

The columns stay JSON. A step's metrics are written flat, as one object (:meth:`StepMetrics.column`), and read back
from one (``of_column``) leniently, since rows written by earlier versions may lack newer keys: a part is there when
its marker key is, and a number it lacks reads as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.store.tables import StepBase, ValidationBase

JUDGE_MARKER = "judge_groups"  # a metrics or totals column holds a judge account when it holds this key
COST_MARKER = "rollout_s"  # and a step's cost when it holds this one


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class JudgeAccount(Record):
    """What judge calls cost and how they went: one step's, or summed, a job's (the API's ``JudgeTotals``)."""

    judge_responses: float = Field(description="Judge responses received (retried calls count each time).")
    judge_prompt_tokens: float
    judge_completion_tokens: float
    judge_cost_usd: float = Field(description="From litellm's price map; responses of unpriced models add nothing.")
    judge_unpriced: float = Field(description="Responses whose model litellm has no price for.")
    judge_groups: float = Field(description="Groups given to the judge.")
    judge_dropped_groups: float = Field(description="Groups the judge could not score after retries (left out of training).")
    judge_attempts: float
    judge_clamped_scores: float = Field(description="Scores outside [0, 1] that were clamped.")
    # judge calls tried again, by why (judges/judgement.py RETRY_KINDS); rows written before these were kept read 0
    judge_retries_timeout: float = Field(0.0, description="Judge calls retried after a timeout.")
    judge_retries_rate_limited: float = Field(0.0, description="Judge calls retried after a 429.")
    judge_retries_server_error: float = Field(0.0, description="Judge calls retried after a 5xx or a lost connection.")
    judge_retries_malformed: float = Field(0.0, description="Judge calls retried after an answer that was not one "
                                           "valid score per trajectory (invalid JSON, ids missing or repeated).")

    @classmethod
    def of_column(cls, flat: Mapping[str, Any]) -> JudgeAccount | None:
        """The account a metrics or totals column holds; None where nothing was judged."""
        if JUDGE_MARKER not in flat:
            return None
        return cls(**{key: float(flat.get(key) or 0.0) for key in JudgeAccount.model_fields})


class StepJudge(JudgeAccount):
    """A step's judge account, with how the judge ranked the step's groups."""

    judge_agreement: float | None = None  # mean rank correlation of the judge's scores with the own rewards

    @classmethod
    def of_column(cls, flat: Mapping[str, Any]) -> StepJudge | None:
        account = JudgeAccount.of_column(flat)
        return None if account is None else cls(**account.model_dump(), judge_agreement=flat.get("judge_agreement"))

    def column(self) -> dict[str, float]:
        """As stored: the agreement only where the judge ranked a group."""
        return self.model_dump(exclude_none=True)


class StepCost(Record):
    """What a step cost the policy's side: wall time per phase and the tokens generated. Summed, a job's
    (``TrainingStep.totals``): nothing spent is all zeros."""

    rollout_s: float = 0.0  # gathering the rollouts, less the time a judge call was in flight
    judge_s: float = 0.0  # with at least one judge call in flight (judging overlaps the rollouts it follows)
    train_s: float = 0.0
    tokens_generated: float = 0.0  # by the policy, over the step's rollouts

    @classmethod
    def of_column(cls, flat: Mapping[str, Any]) -> StepCost | None:
        """The cost a metrics or totals column holds; None where it holds none (no step yet)."""
        if COST_MARKER not in flat:
            return None
        return cls(**{key: flat.get(key, 0.0) for key in cls.model_fields})


class StepMetrics(Record):
    """A step's ``metrics`` column: every number the backend reported for the step, then the step's own."""

    backend: dict[str, float] = Field(default_factory=dict)
    cost: StepCost | None = None
    rollout_exceptions: float | None = None  # rollouts that raised (a step tolerates a few)
    judge: StepJudge | None = None  # in judged modes

    def column(self) -> dict[str, float]:
        """The one flat object stored (a number of the step's own wins over a backend's of the same name)."""
        exceptions = {"rollout_exceptions": self.rollout_exceptions} if self.rollout_exceptions is not None else {}
        return {
            **self.backend,
            **(self.cost.model_dump() if self.cost is not None else {}),
            **exceptions,
            **(self.judge.column() if self.judge is not None else {}),
        }

    @classmethod
    def of_column(cls, flat: Mapping[str, Any]) -> StepMetrics:
        cost, judge = StepCost.of_column(flat), StepJudge.of_column(flat)
        own = {"rollout_exceptions"} | set(StepCost.model_fields if cost else ()) | set(StepJudge.model_fields if judge else ())
        return cls(backend={key: value for key, value in flat.items() if key not in own}, cost=cost,
                   rollout_exceptions=flat.get("rollout_exceptions"), judge=judge)  # fmt: skip


class StepCreate(StepBase):
    """A training step as the loop records it (``TrainingStep`` adds the metrics column and the running totals)."""

    model_config = ConfigDict(frozen=True)

    metrics: StepMetrics = Field(default_factory=StepMetrics)

    @field_validator("metrics", mode="before")
    @classmethod
    def _read_column(cls, value: Any) -> Any:
        """The metrics may come as the column's flat object, as stored."""
        return StepMetrics.of_column(value) if isinstance(value, Mapping) else value

    def columns(self) -> dict[str, Any]:
        """The values given, as the step's event carries them (the metrics column apart)."""
        return self.model_dump(exclude={"metrics"}, exclude_unset=True)


class ValidationCreate(ValidationBase):
    """A validation point as the loop records it."""

    model_config = ConfigDict(frozen=True)

    def columns(self) -> dict[str, Any]:
        """The values given, as the point's row and its event carry them."""
        return self.model_dump(exclude_unset=True)
