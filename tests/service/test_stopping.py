import pytest
from pydantic import ValidationError

from service.runner.stopping import decide, target
from service.spec import ValidationSpec
from service.store.tables import StopReason


def run(series, *, step=None, max_steps=100, patience=3, min_delta=0.01, target=None):
    step = series[-1][0] if step is None else step
    return decide(series, step=step, max_steps=max_steps, patience=patience, min_delta=min_delta, target_accuracy=target)


def test_keeps_going_while_validation_improves():
    decision = run([(0, 0.50), (5, 0.55), (10, 0.60), (15, 0.66)])
    assert decision.stop_reason is None
    assert (decision.best_step, decision.best_accuracy) == (15, 0.66)


def test_plateau_after_patience_evaluations_without_min_delta_gain():
    series = [(0, 0.50), (5, 0.70), (10, 0.705), (15, 0.70), (20, 0.709)]
    decision = run(series)
    assert decision.stop_reason is StopReason.plateau
    assert decision.evaluations_without_gain == 3
    # the best point is the highest accuracy, even though its gain was below min_delta
    assert (decision.best_step, decision.best_accuracy) == (20, 0.709)


def test_one_short_of_patience_does_not_stop():
    assert run([(0, 0.50), (5, 0.70), (10, 0.70), (15, 0.70)]).stop_reason is None


def test_a_real_gain_resets_the_patience_counter():
    series = [(0, 0.5), (5, 0.5), (10, 0.5), (15, 0.52), (20, 0.52), (25, 0.52)]
    decision = run(series)
    assert decision.stop_reason is None and decision.evaluations_without_gain == 2


def test_falling_validation_counts_towards_plateau():
    assert run([(0, 0.8), (5, 0.7), (10, 0.6), (15, 0.5)]).stop_reason is StopReason.plateau


def test_target_reached_wins_over_plateau_and_max_steps():
    series = [(0, 0.9), (5, 0.9), (10, 0.9), (15, 0.95)]
    assert run(series, step=100, max_steps=100, target=0.95).stop_reason is StopReason.target


def test_target_not_yet_reached():
    assert run([(0, 0.5), (5, 0.8)], target=0.9).stop_reason is None


def test_max_steps_when_nothing_else_applies():
    decision = run([(0, 0.5), (5, 0.6)], step=10, max_steps=10)
    assert decision.stop_reason is StopReason.max_steps


def test_ties_pick_the_earliest_step_as_best():
    decision = run([(0, 0.5), (5, 0.6), (10, 0.6)])
    assert decision.best_step == 5


def test_no_validation_yet():
    decision = run([], step=3, max_steps=10)
    assert decision.stop_reason is None and decision.best_step is None


def validation(**fields) -> ValidationSpec:
    return ValidationSpec.model_validate(fields)


def test_a_target_gain_counts_from_the_first_point_and_is_met_through_float_rounding():
    spec = validation(target_gain=0.15)
    assert target(spec, None) is None  # no first point yet: no target
    assert target(spec, 0.27) == 0.27 + 0.15 > 0.42  # 0.42000000000000004
    series = [(0, 0.27), (2, 0.42)]
    assert run(series[:1], target=target(spec, 0.27)).stop_reason is None
    assert run(series, target=target(spec, 0.27)).stop_reason is StopReason.target
    assert run([(0, 0.27), (2, 0.41)], target=target(spec, 0.27)).stop_reason is None


def test_with_a_target_accuracy_and_a_target_gain_the_lower_stops_the_job():
    both = validation(target_accuracy=0.42, target_gain=0.15)
    assert target(both, 0.22) == pytest.approx(0.37) and target(both, 0.30) == 0.42
    assert target(validation(target_accuracy=0.42), 0.22) == 0.42 and target(validation(), 0.22) is None


@pytest.mark.parametrize("gain", [0, -0.1, 1.5, "a lot", None])
def test_a_target_gain_out_of_bounds_is_refused(gain):
    if gain is None:
        assert validation(target_gain=None).target_gain is None
        return
    with pytest.raises(ValidationError, match="target_gain"):
        validation(target_gain=gain)
