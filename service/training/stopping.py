"""Stopping rules, decided from the validation series alone (as recorded in the store).

- target: the latest accuracy reaches ``target_accuracy``;
- plateau: ``patience`` evaluations in a row without a gain of ``min_delta`` over the best so far;
- max_steps: the step budget is spent.
Target wins over plateau, plateau over max_steps. The best point is the highest accuracy
(earliest on ties): the checkpoint an operator would promote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.store.tables import StopReason


@dataclass(frozen=True)
class Decision:
    stop_reason: StopReason | None
    best_step: int | None
    best_accuracy: float | None
    evaluations_without_gain: int


def decide(
    series: Sequence[tuple[int, float]],
    *,
    step: int,
    max_steps: int,
    patience: int,
    min_delta: float,
    target_accuracy: float | None,
) -> Decision:
    """Whether to stop after ``step``, given the (step, accuracy) validation points so far."""
    if not series:
        return Decision(StopReason.max_steps if step >= max_steps else None, None, None, 0)
    best_step, best_accuracy = max(series, key=lambda point: (point[1], -point[0]))
    anchor = series[0][1]
    without_gain = 0
    for _, accuracy in series[1:]:
        if accuracy >= anchor + min_delta - 1e-12:
            anchor, without_gain = accuracy, 0
        else:
            without_gain += 1
    reason = None
    if target_accuracy is not None and series[-1][1] >= target_accuracy:
        reason = StopReason.target
    elif without_gain >= patience:
        reason = StopReason.plateau
    elif step >= max_steps:
        reason = StopReason.max_steps
    return Decision(reason, best_step, best_accuracy, without_gain)
