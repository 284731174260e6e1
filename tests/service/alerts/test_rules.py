"""The alert rules on constructed series: each fires where it should, with its numbers, and stays quiet on
healthy training; properties over arbitrary finite series."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.alerts.rules import KINDS, Candidate, StepPoint, ValPoint, evaluate
from service.runner.stopping import decide
from service.spec import AlertSpec, ValidationSpec
from service.store.tables import StopReason

VALIDATION = ValidationSpec(patience=3, min_delta=0.01)


def alerts_of(steps=(), points=(), *, validation: ValidationSpec = VALIDATION, **thresholds) -> list[Candidate]:
    return evaluate(steps, points, alerts=AlertSpec(**thresholds), validation=validation)


def kinds_at(candidates: list[Candidate]) -> list[tuple[str, int]]:
    return [(c.kind, c.step) for c in candidates]


def training(rewards, *, zero=None, kl=None, groups=8) -> list[StepPoint]:
    """Steps 1..n with these mean rewards (and per-step zero-variance groups and KL where given)."""
    zero = zero or [0] * len(rewards)
    kl = kl or [0.15] * len(rewards)
    return [StepPoint(i + 1, r, groups, z, k) for i, (r, z, k) in enumerate(zip(rewards, zero, kl))]


def validation(accuracies, *, every=2) -> list[ValPoint]:
    """Evaluations at steps 0, every, 2 * every, ..."""
    return [ValPoint(i * every, a) for i, a in enumerate(accuracies)]


def test_healthy_training_raises_no_alert():
    rewards = [0.2 + 0.02 * i for i in range(12)]
    found = alerts_of(training(rewards, zero=[1] * 12), validation([0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]))
    assert found == []


def test_noisy_flat_reward_raises_no_alert():
    rng = random.Random(7)
    rewards = [0.4 + rng.uniform(-0.03, 0.03) for _ in range(200)]
    kl = [rng.uniform(0.1, 0.2) for _ in range(200)]  # the healthy band
    assert alerts_of(training(rewards, kl=kl)) == []


def test_plateau_fires_once_where_the_stopping_rule_first_holds():
    points = validation([0.5, 0.6, 0.6, 0.605, 0.6, 0.59])  # after 0.6, three evaluations without a gain of 0.01
    found = alerts_of(points=points)
    assert kinds_at(found) == [("plateau", 8)]
    assert found[0].evidence == {"evaluations_without_gain": 3, "patience": 3, "min_delta": 0.01, "best_step": 6,
                                 "best_accuracy": 0.605, "accuracy": 0.6}  # fmt: skip
    series = [(p.step, p.accuracy) for p in points]
    decided = [decide(series[:n], step=series[n - 1][0], max_steps=100, patience=3, min_delta=0.01,
                      target_accuracy=None) for n in (4, 5)]  # fmt: skip
    assert [d.stop_reason for d in decided] == [None, StopReason.plateau]  # the same test as the stopping rule


def test_plateau_does_not_fire_while_validation_keeps_gaining():
    assert alerts_of(points=validation([0.1 * i for i in range(10)])) == []


def test_divergence_fires_when_validation_falls_while_reward_rises():
    found = alerts_of(training([0.3, 0.4, 0.5, 0.6]), validation([0.6, 0.55, 0.5]), divergence_window=3)
    assert kinds_at(found) == [("divergence", 4)]
    evidence = found[0].evidence
    assert evidence["val_steps"] == [0, 2, 4] and evidence["val_accuracy"] == [0.6, 0.55, 0.5]
    assert evidence["val_drop"] == pytest.approx(0.1) and evidence["reward_slope"] == pytest.approx(0.1)
    assert (evidence["reward_steps"], evidence["reward_first"], evidence["reward_last"]) == (4, 0.3, 0.6)
    assert "reward hacking" in found[0].message


def test_divergence_needs_rising_reward_a_real_fall_and_no_bounce():
    falling_val = validation([0.6, 0.55, 0.5])
    assert alerts_of(training([0.6, 0.5, 0.4, 0.3]), falling_val) == []  # both fall: broken, not hacked
    assert alerts_of(training([0.3, 0.4, 0.5, 0.6]), validation([0.5, 0.55, 0.6])) == []  # both rise: learning
    assert alerts_of(training([0.3, 0.4, 0.5, 0.6]), validation([0.6, 0.6, 0.595])) == []  # fell less than min_delta
    assert alerts_of(training([0.3, 0.4, 0.5, 0.6]), validation([0.6, 0.65, 0.5])) == []  # rose above its start


def test_divergence_fires_once_while_it_holds_and_again_after_it_stopped():
    rewards = [0.1 + 0.05 * i for i in range(12)]  # rising throughout
    points = validation([0.6, 0.55, 0.5, 0.45, 0.6, 0.5, 0.4])  # falls (4, 6), recovers (8), falls again (12)
    found = alerts_of(training(rewards), points, divergence_window=3, validation=ValidationSpec(patience=10))
    assert kinds_at(found) == [("divergence", 4), ("divergence", 12)]


def test_reward_jump_after_a_plateau():
    rewards = [0.30, 0.31, 0.30, 0.32, 0.31, 0.30, 0.62, 0.63]
    found = alerts_of(training(rewards), reward_jump=0.2, reward_plateau_steps=5)
    assert kinds_at(found) == [("reward_jump", 7)]
    evidence = found[0].evidence
    assert (evidence["reward_before"], evidence["reward"], evidence["threshold"], evidence["plateau_steps"]) == (
        0.30, 0.62, 0.2, 5)  # fmt: skip
    assert evidence["rise"] == pytest.approx(0.32) and evidence["plateau_range"] == pytest.approx(0.02)


def test_reward_jump_needs_a_plateau_before_and_a_big_enough_rise():
    assert alerts_of(training([0.1 + 0.25 * i for i in range(8)]), reward_jump=0.2) == []  # steady climb, no plateau
    assert alerts_of(training([0.3] * 6 + [0.45]), reward_jump=0.2) == []  # rise below the threshold
    assert alerts_of(training([0.3, 0.3, 0.3, 0.9]), reward_jump=0.2, reward_plateau_steps=5) == []  # too few steps


def test_collapse_fires_where_it_newly_holds():
    found = alerts_of(training([0.5] * 5, zero=[1, 7, 8, 2, 6]), collapse_fraction=0.75, rearm_steps=1)
    assert kinds_at(found) == [("collapse", 2), ("collapse", 5)]
    assert found[0].evidence == {"zero_variance_groups": 7, "groups": 8, "fraction": 0.875, "threshold": 0.75}
    assert found[1].evidence["fraction"] == 0.75  # the threshold itself counts
    assert "7 of 8 groups" in found[0].message


def test_kl_spike_fires_when_it_newly_crosses():
    found = alerts_of(training([0.5] * 6, kl=[0.1, 0.6, 0.7, 0.2, None, 0.9]), kl_threshold=0.5, rearm_steps=1)
    assert kinds_at(found) == [("kl_spike", 2), ("kl_spike", 6)]
    assert found[0].evidence == {"kl": 0.6, "threshold": 0.5}


# The main job's exact KL over its first 24 steps (bench/results/math_rl_zen4_slow_1129_exact_kl.json), healthy drift
# that crosses 0.5 at steps 6, 10, 14, 18, 21 and 23.
MAIN_JOB_KL = [0.0, 0.014, 0.012, 0.156, 0.374, 0.503, 0.449, 0.223, 0.098, 0.597, 0.388, 0.134, 0.291, 0.547, 0.563,
               0.381, 0.457, 0.518, 0.556, 0.41, 0.534, 0.445, 0.533, 0.387]  # fmt: skip


def test_a_reading_that_flickers_across_its_threshold_fires_once():
    steps = training([0.5] * len(MAIN_JOB_KL), kl=MAIN_JOB_KL)
    assert kinds_at(alerts_of(steps, rearm_steps=1)) == [("kl_spike", s) for s in (6, 10, 14, 18, 21, 23)]
    assert kinds_at(alerts_of(steps)) == [("kl_spike", 6)]  # never 5 steps clear after it: one condition


FLICKER = [False, True, False, False, True, False, False, False, True]  # holds at steps 2, 5 and 9: clear 2 steps, then 3


@pytest.mark.parametrize("kind", ["kl_spike", "collapse", "judge_disagreement"])
def test_a_condition_fires_again_after_rearm_steps_clear(kind):
    steps = {
        "kl_spike": training([0.5] * 9, kl=[0.9 if h else 0.1 for h in FLICKER]),
        "collapse": training([0.5] * 9, zero=[8 if h else 0 for h in FLICKER]),
        "judge_disagreement": judged([0] * 9, agreement=[-0.5 if h else 0.5 for h in FLICKER]),
    }[kind]
    thresholds = {"judge_agreement": 0.0, "judge_agreement_window": 1}
    assert kinds_at(alerts_of(steps, rearm_steps=3, **thresholds)) == [(kind, 2), (kind, 9)]
    assert kinds_at(alerts_of(steps, rearm_steps=2, **thresholds)) == [(kind, 2), (kind, 5), (kind, 9)]


def test_alerts_come_ordered_by_step_then_kind():
    steps = training([0.3, 0.4, 0.5, 0.6], zero=[0, 0, 0, 8], kl=[0.1, 0.1, 0.1, 0.9])
    found = alerts_of(steps, validation([0.6, 0.55, 0.5]), divergence_window=3)
    assert kinds_at(found) == [("divergence", 4), ("collapse", 4), ("kl_spike", 4)]


def judged(dropped: list[int], *, groups: int = 4, agreement: list[float | None] | None = None) -> list[StepPoint]:
    """Steps 1..n of a judged job: ``groups`` given to the judge each step, ``dropped[i]`` of them unscored."""
    agreement = agreement or [None] * len(dropped)
    return [StepPoint(i + 1, 0.5, groups - d, 0, 0.1, groups, d, a) for i, (d, a) in enumerate(zip(dropped, agreement))]


def test_judge_failures_fires_once_the_share_of_unscored_groups_reaches_the_threshold():
    found = alerts_of(judged([0, 1, 0, 3, 0, 0]), judge_failure_rate=0.2)  # 0/4, 1/8, 1/12, 4/16, 4/20, 4/24
    assert kinds_at(found) == [("judge_failures", 4)]  # once, though it still holds at step 5
    assert found[0].evidence == {"dropped_groups": 4, "judged_groups": 16, "rate": 0.25, "threshold": 0.2}


def test_judge_failures_re_arms_after_rearm_steps_clear():
    # the running share 0/4, 3/8, 3/12, 3/16, 5/20, 5/24, 5/28, 5/32, 9/36 holds at steps 2, 3, 5 and 9 (0.25 counts)
    steps = judged([0, 3, 0, 0, 2, 0, 0, 0, 4])
    assert kinds_at(alerts_of(steps, judge_failure_rate=0.25, rearm_steps=1)) == [("judge_failures", s) for s in (2, 5, 9)]
    assert kinds_at(alerts_of(steps, judge_failure_rate=0.25, rearm_steps=2)) == [("judge_failures", s) for s in (2, 9)]


def test_judge_failures_needs_a_few_groups_before_it_speaks():
    assert kinds_at(alerts_of(judged([1], groups=2), judge_failure_rate=0.2)) == []  # 1 of 2: too few to say
    assert kinds_at(alerts_of(judged([1, 1], groups=2), judge_failure_rate=0.2)) == [("judge_failures", 2)]


def test_judge_disagreement_fires_when_the_mean_rank_correlation_falls_under_the_threshold():
    agreement = [0.9, 0.8, None, 0.1, -0.2, -0.5, 0.9, 0.9, 0.9]
    found = alerts_of(judged([0] * 9, agreement=agreement), judge_agreement=0.2, judge_agreement_window=3)
    # means over the judged steps: (0.9, 0.8, 0.1) 0.6, (0.8, 0.1, -0.2) 0.23, (0.1, -0.2, -0.5) -0.2 fires at step 6
    assert kinds_at(found) == [("judge_disagreement", 6)]
    assert found[0].evidence["steps"] == [4, 5, 6] and found[0].evidence["agreement"] == pytest.approx(-0.2)


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@st.composite
def series(draw) -> tuple[list[StepPoint], list[ValPoint]]:
    """Arbitrary finite series as the store holds them: increasing steps, zero-variance groups within groups."""
    steps, step = [], 0
    for _ in range(draw(st.integers(0, 30))):
        step += draw(st.integers(1, 3))
        groups = draw(st.integers(0, 16))
        kl = draw(st.none() | st.floats(min_value=0, max_value=100))
        judged = draw(st.integers(0, groups))
        agreement = draw(st.none() | st.floats(min_value=-1, max_value=1))
        steps.append(StepPoint(step, draw(finite), groups, draw(st.integers(0, groups)), kl, judged,
                               draw(st.integers(0, judged)), agreement))  # fmt: skip
    at = sorted(draw(st.sets(st.integers(0, step + 1), max_size=15)))
    return steps, [ValPoint(s, draw(st.floats(min_value=0, max_value=1))) for s in at]


thresholds = st.builds(
    AlertSpec,
    divergence_window=st.integers(2, 5),
    kl_threshold=st.floats(min_value=0.01, max_value=10),
    collapse_fraction=st.floats(min_value=0.01, max_value=1),
    reward_jump=st.floats(min_value=0.01, max_value=10),
    reward_plateau_steps=st.integers(2, 6),
    judge_failure_rate=st.floats(min_value=0.01, max_value=1),
    judge_agreement=st.floats(min_value=-1, max_value=1),
    judge_agreement_window=st.integers(1, 5),
    rearm_steps=st.integers(1, 8),
)
stopping = st.builds(ValidationSpec, patience=st.integers(1, 4), min_delta=st.floats(min_value=0, max_value=0.1))


@given(series(), thresholds, stopping, st.randoms())
def test_rules_are_deterministic_and_total_on_any_finite_series(drawn, alerts, validation_spec, rng):
    steps, points = drawn
    found = evaluate(steps, points, alerts=alerts, validation=validation_spec)
    shuffled_steps, shuffled_points = rng.sample(steps, len(steps)), rng.sample(points, len(points))
    assert evaluate(shuffled_steps, shuffled_points, alerts=alerts, validation=validation_spec) == found
    keys = [(c.kind, c.step) for c in found]
    assert len(set(keys)) == len(keys) and all(kind in KINDS for kind, _ in keys)  # the store's unique key holds
    assert {step for _, step in keys} <= {s.step for s in steps} | {p.step for p in points}


@given(series(), thresholds, stopping, st.integers(-1, 100))
def test_rows_recorded_later_never_change_an_alert_already_given(drawn, alerts, validation_spec, cut):
    steps, points = drawn
    full = evaluate(steps, points, alerts=alerts, validation=validation_spec)
    prefix = evaluate([s for s in steps if s.step <= cut], [p for p in points if p.step <= cut], alerts=alerts,
                      validation=validation_spec)  # fmt: skip
    assert prefix == [c for c in full if c.step <= cut]
