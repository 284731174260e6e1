"""Running totals: each training step row carries the sums of its job's steps up to it (``TrainingStep.totals``).

Recording a step then reads one row, the step before, instead of every step of the job, and a job's totals
are its newest row's. A resume that discards later steps leaves the kept rows' totals right as they are.
The sums are taken in step order, as summing every row would, so they are the same floats to the last bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from service.store.records import JUDGE_MARKER, JudgeAccount, StepCost

JUDGE_TOTALS = tuple(JudgeAccount.model_fields)  # summed over the judged steps
STEP_TOTALS = tuple(StepCost.model_fields)  # over every step, judged or not
JUDGED_STEPS = "judged_steps"  # steps with a judge account


def advanced(totals: Mapping[str, float], metrics: Mapping[str, Any]) -> dict[str, float]:
    """The totals after one more step with these metrics (``totals`` empty: the job's first step), both columns
    as stored (service/store/records.py says what they hold)."""
    keys = STEP_TOTALS + ((JUDGED_STEPS, *JUDGE_TOTALS) if JUDGE_MARKER in metrics else ())
    own = {**metrics, JUDGED_STEPS: 1.0}
    return {**totals, **{key: totals.get(key, 0.0) + float(own.get(key) or 0.0) for key in keys}}


def judge_totals(totals: Mapping[str, float], unrecorded: Sequence[Mapping[str, Any]] = ()) -> dict[str, float] | None:
    """A job's judge account: its newest step's ``totals`` and then the judging of steps that recorded no row
    (``runs.unrecorded_judging``); None if nothing was judged."""
    if not totals.get(JUDGED_STEPS) and not unrecorded:
        return None
    summed = {key: totals.get(key, 0.0) for key in JUDGE_TOTALS}
    for metrics in unrecorded:
        summed = {key: value + float(metrics.get(key) or 0.0) for key, value in summed.items()}
    return summed
