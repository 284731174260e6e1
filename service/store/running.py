"""Running totals: each training step row carries the sums of its job's steps up to it (``TrainingStep.totals``).

Recording a step then reads one row, the step before, instead of every step of the job, and a job's totals
are its newest row's. A resume that discards later steps leaves the kept rows' totals right as they are.
The sums are taken in step order, as summing every row would, so they are the same floats to the last bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

JUDGE_TOTALS = ("judge_responses", "judge_prompt_tokens", "judge_completion_tokens", "judge_cost_usd", "judge_unpriced",
                "judge_groups", "judge_dropped_groups", "judge_attempts", "judge_clamped_scores")  # fmt: skip
STEP_TOTALS = ("tokens_generated", "rollout_s", "judge_s", "train_s")  # over every step, judged or not
JUDGED_STEPS = "judged_steps"  # steps with a judge account (judging.py writes ``judge_groups`` into their metrics)


def advanced(totals: Mapping[str, float], metrics: Mapping[str, Any]) -> dict[str, float]:
    """The totals after one more step with these metrics (``totals`` empty: the job's first step)."""
    keys = STEP_TOTALS + ((JUDGED_STEPS, *JUDGE_TOTALS) if "judge_groups" in metrics else ())
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
