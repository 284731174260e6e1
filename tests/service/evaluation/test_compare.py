"""The promotion gate's arithmetic (service/evaluation/compare.py), on per-example results alone."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np

from service.evaluation.compare import BOOTSTRAP_SEED, Measured, compare

# A 2048 job's 100 validation games at step 0 and at step 8 (won: 1), in scenario order: 21 won, then 33
# (bench/results/twenty48_rl_zen5_1207c_stuck_seed1.json)
STEP0 = "0001000010000000100000100011000111001000000000010000110101000000000000110100001000010001000000000000"
STEP8 = "0100100010100000111000101001101111010000000010011010000001011000010000011100001100000001000000110001"


def measured(step: int, won: str) -> Measured:
    results = [SimpleNamespace(scenario_id=f"s{i}", outcome="win" if w == "1" else "turn_limit", correct=w == "1")
               for i, w in enumerate(won)]  # fmt: skip
    return Measured("job", "job", step, {"locked": {}}, results)


def test_a_lower_bound_of_exactly_min_delta_clears_it_where_a_difference_of_means_rounded_it_under():
    verdict = compare(measured(0, STEP0), measured(8, STEP8), min_delta=0.02)
    overall = verdict["overall"]
    assert (overall["baseline"], overall["candidate"], overall["delta"]) == (0.21, 0.33, 0.12)
    assert (overall["ci_low"], overall["ci_high"]) == (0.02, 0.22)  # 2 and 22 games of 100, exactly
    assert verdict["decision"] == "ACCEPT" and verdict["reasons"] == []
    assert compare(measured(0, STEP0), measured(8, STEP8), min_delta=0.021)["decision"] == "REJECT"


def test_every_bound_is_the_percentile_of_the_exact_deltas_of_the_resamples():
    base, cand = (np.array([w == "1" for w in won], float) for won in (STEP0, STEP8))
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, 100, size=(2000, 100))
    exact = [float(Fraction(int(cand[p].sum() - base[p].sum()), 100)) for p in picks]
    low, high = np.percentile(exact, [2.5, 97.5])
    overall = compare(measured(0, STEP0), measured(8, STEP8))["overall"]
    assert (overall["ci_low"], overall["ci_high"]) == (low, high)
