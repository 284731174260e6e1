"""bench/gate_power.py: outcomes drawn with a given coupling show it again when measured, and coupling raises power."""

import importlib.util
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"
spec = importlib.util.spec_from_file_location("gate_power", BENCH / "gate_power.py")
gate_power = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gate_power)


def _result(step0: np.ndarray, best: np.ndarray, best_step: int = 6) -> dict:
    rows = [{"step": step, "scenario_id": f"s{i}", "correct": bool(ok)}
            for step, side in ((0, step0), (best_step, best)) for i, ok in enumerate(side)]  # fmt: skip
    return {"summary": {"best_step": best_step}, "examples": rows}


def test_a_coupling_drawn_is_the_coupling_measured():
    for coupling in (0.0, 0.5, 1.0):
        step0, best = gate_power.draw(20_000, 0.22, 0.31, coupling, np.random.default_rng(0))
        measured = gate_power.coupling_of(_result(step0, best))
        assert abs(measured["coupling"] - coupling) < 0.03 and measured["examples"] == 20_000
        assert abs(measured["step0"] - 0.22) < 0.01 and abs(measured["best"] - 0.31) < 0.01


def test_nothing_to_measure_is_none_and_coupled_outcomes_pass_the_gate_more_often():
    assert gate_power.coupling_of(_result(np.zeros(10), np.ones(10))) is None  # one outcome on each side
    assert gate_power.coupling_of(_result(np.zeros(10), np.zeros(10), best_step=0)) is None  # the best is step 0
    rates = [gate_power.power(100, 0.22, 0.34, coupling=c, trials=60, rng=np.random.default_rng(1))["accept_rate"]
             for c in (0.0, 0.9)]  # fmt: skip
    assert rates[1] > rates[0]
