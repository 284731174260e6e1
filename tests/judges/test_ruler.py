"""RULER under a judge that misbehaves: a real OpenAI-compatible server on loopback, through litellm."""

from __future__ import annotations

import asyncio
import json
import time

import art
import pytest

from judges.ruler import JudgeConfig, RulerJudge
from tests.judges.judge_server import Behaviour, judge_server

# litellm leaves its logging coroutines pending when a test's loop closes; nothing of ours is at stake
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'Logging.async_success_handler' was never awaited")

TOOLS = [{"type": "function", "function": {"name": "return_final_answer", "parameters": {"type": "object"}}}]


def trajectory(question: str, answer: str, reward: float) -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Answer the question. End with Final: <answer>."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ],
        tools=TOOLS,
        reward=reward,
        metrics={"turns": 1},
        metadata={"scenario_id": question},
    )


def group(question: str = "What is 2+2?", size: int = 4) -> art.TrajectoryGroup:
    answers = [f"Final: {4 + i}" if i % 2 == 0 else f"I think it is {4 + i}" for i in range(size)]
    built = art.TrajectoryGroup(
        [trajectory(question, a, reward=float(i % 2 == 0)) for i, a in enumerate(answers)],
        exceptions=[RuntimeError("one rollout crashed")],
        metadata={"scenario": question},
    )
    return built


def judge(server, **overrides) -> RulerJudge:
    settings = {"model": "openai/gpt-4o-mini", "api_base": server.api_base, "api_key": "test", "timeout_s": 5.0,
                "max_retries": 2, "backoff_s": 0.01}  # fmt: skip
    return RulerJudge(JudgeConfig(**{**settings, **overrides}))


@pytest.mark.asyncio
async def test_scores_are_applied_by_trajectory_id_not_by_position():
    distinct = {"1": 0.1, "2": 0.2, "3": 0.3, "4": 0.4}
    backwards = lambda _: dict(reversed(list(distinct.items())))  # noqa: E731 -- listed 4, 3, 2, 1
    with judge_server([Behaviour(scores=backwards)]) as server:
        result = await judge(server).judge(group())
    assert result.failure is None and result.attempts == 1
    assert [t.reward for t in result.group.trajectories] == [0.1, 0.2, 0.3, 0.4]


@pytest.mark.asyncio
async def test_the_group_keeps_its_exceptions_metadata_and_each_trajectory_its_own_reward():
    original = group()
    with judge_server() as server:
        result = await judge(server).judge(original)
    judged = result.group
    assert [e.message for e in judged.exceptions] == ["one rollout crashed"]
    assert judged.metadata == {"scenario": "What is 2+2?"}
    assert [t.metrics["independent_reward"] for t in judged.trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert [t.metrics["ruler_score"] for t in judged.trajectories] == [t.reward for t in judged.trajectories]
    assert [t.reward for t in judged.trajectories] == [0.9, 0.1, 0.9, 0.1]  # the test judge's rubric
    assert all(t.metrics["turns"] == 1 and "RULER" in t.logs[-1] for t in judged.trajectories)
    assert [t.reward for t in original.trajectories] == [1.0, 0.0, 1.0, 0.0]  # the input is left alone


@pytest.mark.asyncio
async def test_scores_outside_0_1_are_clamped_and_the_clamp_is_recorded():
    out_of_range = lambda s: {**s, "1": 1.7, "2": -0.5}  # noqa: E731
    with judge_server([Behaviour(scores=out_of_range)]) as server:
        result = await judge(server).judge(group())
    rewards = [t.reward for t in result.group.trajectories]
    assert rewards[:2] == [1.0, 0.0]
    assert result.clamped == ["trajectory 1: score 1.7 outside [0, 1], clamped to 1.0",
                              "trajectory 2: score -0.5 outside [0, 1], clamped to 0.0"]  # fmt: skip
    assert result.group.trajectories[0].metrics["ruler_raw_score"] == 1.7


@pytest.mark.parametrize(
    ("name", "rewrite"),
    [
        ("fewer", lambda s: dict(list(s.items())[:-1])),
        ("more", lambda s: {**s, "5": 0.5}),
        ("renamed", lambda s: {("9" if k == "1" else k): v for k, v in s.items()}),
    ],
)
@pytest.mark.asyncio
async def test_a_wrong_set_of_scores_is_retried_then_accepted(name, rewrite):
    with judge_server([Behaviour(scores=rewrite)]) as server:
        result = await judge(server).judge(group())
        assert len(server.requests) == 2
    assert result.failure is None and result.attempts == 2 and len(result.retried) == 1
    assert result.retried[0].kind == "malformed" and "malformed verdict" in result.retried[0].reason
    assert [t.reward for t in result.group.trajectories] == [0.9, 0.1, 0.9, 0.1]


@pytest.mark.asyncio
async def test_invalid_json_is_retried_and_its_tokens_are_still_counted():
    with judge_server([Behaviour(body="{'scores': not json"), Behaviour(body="")]) as server:
        result = await judge(server).judge(group())
    assert result.failure is None and result.attempts == 3 and [r.kind for r in result.retried] == ["malformed"] * 2
    assert result.usage.responses == 3  # the broken answers were paid for too
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0 and result.usage.cost_usd > 0


@pytest.mark.asyncio
async def test_a_judge_that_keeps_answering_garbage_drops_the_group_with_the_reason():
    with judge_server([Behaviour(body="nope")] * 3) as server:
        result = await judge(server, max_retries=2).judge(group())
        assert len(server.requests) == 3
    assert result.group is None and result.attempts == 3
    assert result.failure.startswith("malformed verdict")


@pytest.mark.asyncio
async def test_429_is_retried_after_the_time_the_server_asks():
    with judge_server([Behaviour(status=429, headers={"Retry-After": "0.5"})]) as server:
        started = time.monotonic()
        result = await judge(server).judge(group())
        elapsed = time.monotonic() - started
        assert len(server.requests) == 2  # one 429, one answer: the SDK's own retries are off
    assert result.failure is None and result.attempts == 2 and "RateLimitError" in result.retried[0].reason
    assert result.retried[0].kind == "rate_limited"
    assert elapsed >= 0.5


@pytest.mark.asyncio
async def test_a_timeout_is_retried():
    # the retry must answer within the timeout: 0.5 s was too short once on a loaded 2-core machine (a CI run)
    with judge_server([Behaviour(delay_s=30.0)]) as server:
        result = await judge(server, timeout_s=2.0).judge(group())
    assert result.failure is None and result.attempts == 2 and result.retried[0].kind == "timeout"


@pytest.mark.asyncio
async def test_a_judge_that_never_answers_drops_the_group_in_bounded_time():
    with judge_server([Behaviour(delay_s=30.0)] * 3) as server:
        started = time.monotonic()
        result = await judge(server, timeout_s=0.3, max_retries=2).judge(group())
        elapsed = time.monotonic() - started
    assert result.group is None and result.attempts == 3 and result.failure.startswith("timeout")
    assert elapsed < 10


@pytest.mark.asyncio
async def test_errors_that_retrying_cannot_fix_are_not_retried():
    with judge_server([Behaviour(status=401)]) as server:
        result = await judge(server).judge(group())
        assert len(server.requests) == 1
    assert result.group is None and result.attempts == 1 and "AuthenticationError" in result.failure
    assert result.retried == []


@pytest.mark.asyncio
async def test_server_errors_are_retried():
    with judge_server([Behaviour(status=500), Behaviour(status=503)]) as server:
        result = await judge(server).judge(group())
    assert result.failure is None and result.attempts == 3 and [r.kind for r in result.retried] == ["server_error"] * 2


@pytest.mark.asyncio
async def test_a_job_never_has_more_judge_calls_out_than_its_concurrency():
    with judge_server([Behaviour(delay_s=0.3)] * 6) as server:
        ruler = judge(server, concurrency=2)
        results = await asyncio.gather(*(ruler.judge(group(f"question {i}")) for i in range(6)))
        assert server.most_in_flight == 2
    assert all(r.failure is None for r in results)


@pytest.mark.asyncio
async def test_the_prompt_starts_with_what_every_call_shares():
    """The system message (rubric and tools) is identical across groups, and the user message starts
    with the shared context: a provider's prompt cache covers everything up to the question."""
    with judge_server() as server:
        ruler = judge(server)
        await ruler.judge(group("What is 2+2?"))
        await ruler.judge(group("What is 3+5?"))
        first, second = server.requests
    assert first["messages"][0] == second["messages"][0]
    assert json.dumps(TOOLS, sort_keys=True) in first["messages"][0]["content"]
    shared = "<context>\n" + json.dumps([{"role": "system", "content": "Answer the question. End with Final: <answer>."}])[:-1]
    assert first["messages"][1]["content"].startswith(shared) and second["messages"][1]["content"].startswith(shared)
    assert first["response_format"]["type"] == "json_schema"


@pytest.mark.asyncio
async def test_identical_trajectories_are_judged_once_and_scored_alike():
    same = art.TrajectoryGroup([trajectory("q", "Final: 4", 1.0) for _ in range(3)])
    with judge_server() as server:
        result = await judge(server).judge(same)
    assert [t.reward for t in result.group.trajectories] == [0.9, 0.9, 0.9]
