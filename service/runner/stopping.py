"""When a job stops: every stop reason a run ends with, other than an error, is decided here.

After a validation point (:func:`after_validation`), from the validation series as recorded in the store:

- target: the latest accuracy reaches ``target_accuracy``, or the series' first point's plus ``target_gain``;
- plateau: ``patience`` evaluations in a row without a gain of ``min_delta`` over the best so far;
- max_steps: the step budget is spent;
- divergence: the divergence alert fired and the job asked to stop on it;
- beat_baseline: the latest accuracy beats the baseline model's by ``beat_baseline_by``.
Each wins over the ones after it. The best point is the highest accuracy (earliest on ties): the
checkpoint an operator would promote.

At a boundary before more work (:func:`at_boundary`), training steps and evaluation rollouts alike:

- cancelled: a cancel was asked for through the store;
- budget: the job's judge calls spent ``reward.max_judge_cost_usd``.

The series is read as a fold (service/store/progress.py), which the store keeps on each point, so a
decision after a new point reads no point before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from service.spec import JobSpec, ValidationSpec
from service.store.progress import Progress, fold
from service.store.tables import StopReason

TOLERANCE = 1e-12  # a target met up to float rounding is met: 0.27 + 0.15 is 0.42000000000000004


@dataclass(frozen=True)
class Decision:
    """Whether to stop (None: go on) and the best point so far, which the job records when it ends."""

    stop_reason: StopReason | None
    best_step: int | None
    best_accuracy: float | None
    evaluations_without_gain: int


def decide_from(
    progress: Progress | None, *, step: int, max_steps: int, patience: int, target_accuracy: float | None
) -> Decision:
    """Whether to stop after ``step``, given the validation series folded so far (None: no point yet)."""
    if progress is None:
        return Decision(StopReason.max_steps if step >= max_steps else None, None, None, 0)
    reason = None
    if target_accuracy is not None and progress.accuracy >= target_accuracy - TOLERANCE:
        reason = StopReason.target
    elif progress.evaluations_without_gain >= patience:
        reason = StopReason.plateau
    elif step >= max_steps:
        reason = StopReason.max_steps
    return Decision(reason, progress.best_step, progress.best_accuracy, progress.evaluations_without_gain)


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


def target(spec: ValidationSpec, first_accuracy: float | None) -> float | None:
    """The accuracy that stops a job by target: ``target_accuracy``, or the first point's accuracy plus
    ``target_gain``, the lower of the two where both are set (None: no target, or a gain with no first point yet)."""
    targets = [spec.target_accuracy]
    if spec.target_gain is not None and first_accuracy is not None:
        targets.append(first_accuracy + spec.target_gain)
    return min((t for t in targets if t is not None), default=None)


def after_validation(
    progress: Progress | None,
    *,
    step: int,
    spec: JobSpec,
    diverged: Callable[[], bool],
    baseline_accuracy: float | None,
    first_accuracy: float | None,
) -> Decision:
    """Whether a training job stops after ``step``, given its validation series folded so far. ``diverged`` (a
    store read) is asked only when the job stops on divergence and no rule before it stopped the job;
    ``baseline_accuracy`` is the baseline model's (None: the job names none); ``first_accuracy`` is the series' first
    point's, which ``target_gain`` counts from."""
    v = spec.validation
    decision = decide_from(progress, step=step, max_steps=spec.training.max_steps, patience=v.patience,
                           target_accuracy=target(v, first_accuracy))  # fmt: skip
    if decision.stop_reason is None and spec.alerts.stop_on_divergence and diverged():
        return replace(decision, stop_reason=StopReason.divergence)
    if decision.stop_reason is None and _beats(progress, baseline_accuracy, v.beat_baseline_by):
        return replace(decision, stop_reason=StopReason.beat_baseline)
    return decision


def _beats(progress: Progress | None, baseline_accuracy: float | None, margin: float | None) -> bool:
    if progress is None or baseline_accuracy is None or margin is None:
        return False
    return progress.accuracy >= baseline_accuracy + margin - TOLERANCE


def at_boundary(*, cancel_requested: bool, budget_spent: bool = False) -> StopReason | None:
    """Whether a job stops before its next piece of work: a cancel asked through the store, then a judge budget spent."""
    if cancel_requested:
        return StopReason.cancelled
    if budget_spent:
        return StopReason.budget
    return None
