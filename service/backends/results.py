"""What the in-process backends (embedded, transformers) report for a GRPO step, in one shape."""

from __future__ import annotations

from art.types import TrainResult


def grpo_result(step: int, metrics: dict[str, float], *, groups: int, zero_variance: int, learning_rate: float) -> TrainResult:
    """The engine's metrics of the step, and how many groups it trained and skipped (no reward variance)."""
    extra = {"trainable_groups": float(groups - zero_variance), "zero_variance_groups": float(zero_variance),
             "learning_rate": learning_rate}  # fmt: skip
    return TrainResult(step=step, metrics={**metrics, **extra})
