"""Stopping rules, decided from the validation series alone (as recorded in the store).

- target: the latest accuracy reaches ``target_accuracy``;
- plateau: ``patience`` evaluations in a row without a gain of ``min_delta`` over the best so far;
- max_steps: the step budget is spent.
Target wins over plateau, plateau over max_steps. The best point is the highest accuracy
(earliest on ties): the checkpoint an operator would promote.

The series is read as a fold (:class:`Progress`, one :func:`advance` per point), so the store can keep
the fold on each point and decide after a new point without reading the ones before it.
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


@dataclass(frozen=True)
class Progress:
    """The validation series folded up to one point: all the stopping rules read of it."""

    best_step: int
    best_accuracy: float
    anchor_accuracy: float  # the accuracy the next gain of min_delta is measured from
    evaluations_without_gain: int
    accuracy: float  # of the latest point


def advance(progress: Progress | None, step: int, accuracy: float, *, min_delta: float) -> Progress:
    """``progress`` (None: no point yet) after the next point of the series."""
    if progress is None:
        return Progress(step, accuracy, accuracy, 0, accuracy)
    best_step, best_accuracy = max((progress.best_step, progress.best_accuracy), (step, accuracy),
                                   key=lambda point: (point[1], -point[0]))  # fmt: skip
    if accuracy >= progress.anchor_accuracy + min_delta - 1e-12:
        return Progress(best_step, best_accuracy, accuracy, 0, accuracy)
    return Progress(best_step, best_accuracy, progress.anchor_accuracy, progress.evaluations_without_gain + 1, accuracy)


def decide_from(
    progress: Progress | None, *, step: int, max_steps: int, patience: int, target_accuracy: float | None
) -> Decision:
    """Whether to stop after ``step``, given the validation series folded so far (None: no point yet)."""
    if progress is None:
        return Decision(StopReason.max_steps if step >= max_steps else None, None, None, 0)
    reason = None
    if target_accuracy is not None and progress.accuracy >= target_accuracy:
        reason = StopReason.target
    elif progress.evaluations_without_gain >= patience:
        reason = StopReason.plateau
    elif step >= max_steps:
        reason = StopReason.max_steps
    return Decision(reason, progress.best_step, progress.best_accuracy, progress.evaluations_without_gain)


def fold(series: Sequence[tuple[int, float]], *, min_delta: float, progress: Progress | None = None) -> Progress | None:
    """``progress`` after each (step, accuracy) point of ``series`` in turn."""
    for step, accuracy in series:
        progress = advance(progress, step, accuracy, min_delta=min_delta)
    return progress


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
    return decide_from(fold(series, min_delta=min_delta), step=step, max_steps=max_steps, patience=patience,
                       target_accuracy=target_accuracy)  # fmt: skip
