"""bench/trl_grpo.py's reward function and training problems: TRL is given the service's reward and the service's
problems (the benchmark itself, which needs TRL, is run by hand)."""

import importlib.util
from pathlib import Path

from environments.math.env import MathEnvironment
from environments.math.scorer import score
from service.runner.seeding import batch_for_step

spec = importlib.util.spec_from_file_location("trl_grpo", Path(__file__).resolve().parents[1] / "bench" / "trl_grpo.py")
trl_grpo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trl_grpo)


def test_the_reward_function_scores_as_the_strict_scorer_in_both_of_trls_completion_shapes():
    replies = ["Final: 94", " Final: 94\n", "Final: 094", "final: 94", "Final:  94", "Final: 95", "94", "Final: 94 apples"]
    expected = [score({"expected_answer": 94}, r)["reward"] for r in replies]
    assert expected[:2] == [1.0, 1.0] and sum(expected) == 2.0
    answers = [94] * len(replies)
    assert trl_grpo.strict_rewards(replies, answers) == expected
    chats = [[{"role": "assistant", "content": r}] for r in replies]
    assert trl_grpo.strict_rewards(chats, answers, prompts=[[]] * len(replies), completion_ids=[[]]) == expected


def test_trl_trains_on_the_services_problems_in_its_order():
    env = MathEnvironment()
    rows = trl_grpo.train_rows(env, seed=3, steps=2)
    scenarios = [s for step in (1, 2) for s in batch_for_step(env.scenarios("train"), seed=3, step=step, size=8)]
    assert [r["prompt"] for r in rows] == [env.opening(s) for s in scenarios]
    assert [r["expected_answer"] for r in rows] == [s["expected_answer"] for s in scenarios]
