"""bench/env_rl.py's gate on a results file: the promotion gate's verdict on the best step against step 0."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("env_rl", Path(__file__).resolve().parents[1] / "bench" / "env_rl.py")
env_rl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env_rl)


def _result(step0: list[bool], best: list[bool], best_step: int = 4) -> dict:
    def rows(step, correct):
        return [{"step": step, "scenario_id": f"s{i}", "outcome": "win" if ok else "turn_limit", "correct": ok}
                for i, ok in enumerate(correct)]  # fmt: skip

    return {"summary": {"id": "job", "best_step": best_step}, "manifest": {"environment": "2048"},
            "examples": rows(-1, [False] * len(step0)) + rows(0, step0) + rows(best_step, best)}  # fmt: skip


def test_the_gate_accepts_a_clear_lift_and_rejects_one_inside_its_interval():
    clear = env_rl.gate(_result([False] * 50, [True] * 25 + [False] * 25))
    assert clear["decision"] == "ACCEPT" and clear["overall"]["delta"] == 0.5 and clear["candidate_step"] == 4
    # +8 points on 50: 6 games won only by the candidate, 2 only by step 0
    slight = env_rl.gate(_result([True] * 14 + [False] * 36, [False] * 2 + [True] * 18 + [False] * 30))
    assert slight["decision"] == "REJECT" and slight["overall"]["ci_low"] < 0.02 < slight["overall"]["delta"]
    assert (slight["overall"]["candidate_only"], slight["overall"]["baseline_only"]) == (6, 2)
    # the same +8 with no game lost: the interval's lower bound is 1 game of 50, exactly min_delta, which clears it
    # (a difference of two means once rounded it to 0.0199999... and the gate said REJECT)
    edge = env_rl.gate(_result([True] * 14 + [False] * 36, [True] * 18 + [False] * 32))
    assert edge["decision"] == "ACCEPT" and edge["overall"]["ci_low"] == 0.02
    same = env_rl.gate(_result([True] * 14 + [False] * 36, [], best_step=0))
    assert same["decision"] == "REJECT" and same["overall"]["delta"] == 0.0


def test_the_timeline_gives_each_event_the_seconds_since_the_one_before_and_a_point_without_greedy_reads_a_dash():
    events = [("started", None, "2026-11-29 01:00:00.000000"), ("validation", -1, "2026-11-29 01:02:05.500000"),
              ("validation", 0, "2026-11-29 01:09:00.000000"), ("step", 1, "2026-11-29 01:10:30.250000")]  # fmt: skip
    assert env_rl.timeline_of(events) == [
        {"kind": "started", "step": None, "seconds": 0.0}, {"kind": "validation", "step": -1, "seconds": 125.5},
        {"kind": "validation", "step": 0, "seconds": 414.5}, {"kind": "step", "step": 1, "seconds": 90.2},
    ]  # fmt: skip
    assert env_rl._greedy({"greedy_accuracy": None}) == "-" and env_rl._greedy({"greedy_accuracy": 0.25}) == "0.250"
