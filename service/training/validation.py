"""Validation: the policy as it is used (sampled at the job's temperature), with greedy beside it.

Each validation example is sampled with the same seed at every evaluation (common random
numbers), so differences between steps reflect the policy, not the dice.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import art

from environments.base import Environment, Sampling
from service.evaluation.results import completion_tokens, outcome_of
from service.training.seeding import derive_seed


@dataclass(frozen=True)
class ValidationResult:
    accuracy: float
    greedy_accuracy: float
    examples: int
    temperature: float
    outcomes: dict[str, int]
    wall_time_s: float
    tokens_generated: int | None
    trajectories: list[art.Trajectory]

    def row_values(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "greedy_accuracy": self.greedy_accuracy,
            "examples": self.examples,
            "temperature": self.temperature,
            "outcomes": self.outcomes,
            "wall_time_s": self.wall_time_s,
            "tokens_generated": self.tokens_generated,
        }


async def _accuracy(
    env: Environment, model: art.Model, rows: Sequence[dict], *, seed: int, temperature: float
) -> tuple[float, list[art.Trajectory]]:
    trajectories = await art.gather_trajectories(
        (env.rollout(model, row, Sampling(temperature=temperature, seed=derive_seed(seed, "val", row["id"]))) for row in rows),
        pbar_desc=None,
    )
    return sum(env.is_correct(t) for t in trajectories) / len(trajectories), trajectories


async def validate(
    env: Environment, model: art.Model, rows: Sequence[dict], *, seed: int, temperature: float
) -> ValidationResult:
    """Accuracy on ``rows`` at ``temperature`` (the recorded number) and greedily."""
    started = time.monotonic()
    accuracy, trajectories = await _accuracy(env, model, rows, seed=seed, temperature=temperature)
    greedy, greedy_trajectories = await _accuracy(env, model, rows, seed=seed, temperature=0.0)
    tokens = [completion_tokens(t) for t in (*trajectories, *greedy_trajectories)]
    return ValidationResult(
        accuracy=accuracy,
        greedy_accuracy=greedy,
        examples=len(rows),
        temperature=temperature,
        outcomes=dict(sorted(Counter(outcome_of(env, t) for t in trajectories).items())),
        wall_time_s=time.monotonic() - started,
        tokens_generated=None if any(t is None for t in tokens) else sum(tokens),
        trajectories=trajectories,
    )
