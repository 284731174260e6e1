"""The validation series as a fold: what the stopping rules (service/runner/stopping.py) and the plateau alert
read of it, kept on each stored validation point (``ValidationPoint``'s fold columns) so that the newest point
alone says where the series stands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


def fold(series: Sequence[tuple[int, float]], *, min_delta: float, progress: Progress | None = None) -> Progress | None:
    """``progress`` after each (step, accuracy) point of ``series`` in turn."""
    for step, accuracy in series:
        progress = advance(progress, step, accuracy, min_delta=min_delta)
    return progress
