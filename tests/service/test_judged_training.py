"""Judged jobs end to end: the training loop on the embedded backend with RULER from a judge server on
loopback (the real protocol, through litellm), against a real SQLite store."""

from __future__ import annotations

import json

import pytest
from sqlmodel import Session, select

import environments
from judges.judgement import RETRY_KINDS
from service.settings import Settings
from service.store import runs
from service.store.records import JudgeAccount
from service.store.tables import Alert, JobStatus, SampledTrajectory, StopReason
from service.training.judging import JudgeNotAllowed
from service.training.loop import run_job
from tests.judges.judge_server import Behaviour, judge_server
from tests.service.test_training_loop import TINY_RUN, _history, _new_store, _submit

JUDGE = "openai/gpt-4o-mini"  # priced in litellm's local map, served by the test judge


def judged(mode: str = "hybrid", **reward) -> dict:
    return {**TINY_RUN, "reward": {"mode": mode, "judge_model": JUDGE, **reward}}


def settings_for(server, tmp_path, **overrides) -> Settings:
    values = {"data_dir": tmp_path / "data", "judge_models": [JUDGE], "judge_api_base": server.api_base,
              "judge_api_key": "test", "judge_timeout_s": 5.0, "judge_max_retries": 1, "judge_backoff_s": 0.01}  # fmt: skip
    return Settings(**{**values, **overrides})


async def train(engine, job_id, tmp_path, settings):
    return await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=settings)


def exact_schema(request: dict) -> bool:
    """Whether a judge call asked for the exact verdict schema (its ids as constants), not RULER's generic one."""
    return '"const"' in json.dumps(request.get("response_format"))


def step_metrics(engine, job_id):
    with Session(engine) as session:
        return [s.metrics for s in runs.steps(session, job_id=job_id)]


@pytest.mark.asyncio
async def test_a_hybrid_job_trains_on_ruler_rewards_and_stops_on_ground_truth(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    with judge_server() as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
        calls = len(server.requests)
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.max_steps
    steps, points = _history(engine, job_id)
    assert [p[0] for p in points] == [0, 2, 4] and all(p[2] is not None for p in points)  # ground truth, greedy beside
    metrics = step_metrics(engine, job_id)
    assert calls == 4 * 2  # one call per group: 4 steps of 2 groups
    assert all(m["judge_groups"] == 2 and m["judge_dropped_groups"] == 0 for m in metrics)
    assert all(m["judge_prompt_tokens"] > 0 and m["judge_cost_usd"] > 0 for m in metrics)
    with Session(engine) as session:
        totals = runs.judge_totals(session, job_id=job_id)
        rows = session.exec(select(SampledTrajectory).where(SampledTrajectory.job_id == job_id)).all()
    assert totals["judge_groups"] == 8 and totals["judge_cost_usd"] == sum(m["judge_cost_usd"] for m in metrics)
    assert all(m["judge_s"] > 0 and m["tokens_generated"] > 0 for m in metrics)  # a phase of its own, and the policy's tokens
    with Session(engine) as session:
        cost = runs.cost_totals(session, job_id=job_id)
    assert cost["judge_cost_usd"] == totals["judge_cost_usd"] and cost["judge_prompt_tokens"] == totals["judge_prompt_tokens"]
    assert cost["tokens_generated_train"] == sum(m["tokens_generated"] for m in metrics)
    assert cost["tokens_generated_validation"] > 0 and all(cost["wall_s"][phase] > 0 for phase in ("rollout", "judge", "validation"))
    train_rows = [r for r in rows if r.split == "train"]
    assert train_rows and {r.reward for r in train_rows} <= {0.1, 0.9}  # the judge's scores, not the verifier's
    assert all("independent_reward" in r.details["metrics"] for r in train_rows)


@pytest.mark.asyncio
async def test_a_judge_held_to_exact_verdicts_is_asked_for_them_and_the_manifest_says_so(tmp_path):
    engine = _new_store(tmp_path)
    exact_job, generic_job = _submit(engine, judged()), _submit(engine, judged())
    with judge_server() as server:
        await train(engine, exact_job, tmp_path, settings_for(server, tmp_path, judge_exact_verdicts=True))
        asked = [exact_schema(r) for r in server.requests]
        await train(engine, generic_job, tmp_path, settings_for(server, tmp_path))
        generic_asked = [exact_schema(r) for r in server.requests[len(asked):]]
    assert asked and all(asked) and generic_asked and not any(generic_asked)
    with Session(engine) as session:
        judges = [runs.get_job(session, job_id=j).manifest["judge"] for j in (exact_job, generic_job)]
    assert judges[0]["exact_verdicts"] is True and "exact_verdicts" not in judges[1]


@pytest.mark.asyncio
async def test_groups_the_judge_cannot_score_are_dropped_and_the_rest_train(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    with judge_server([Behaviour(status=401)]) as server:  # the first group's call is refused, not retried
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    assert job.status is JobStatus.succeeded and job.step == 4
    metrics = step_metrics(engine, job_id)
    assert [m["judge_dropped_groups"] for m in metrics] == [1, 0, 0, 0]
    with Session(engine) as session:
        first = runs.steps(session, job_id=job_id)[0]
        alerts = session.exec(select(Alert).where(Alert.job_id == job_id)).all()
    assert first.groups == 1  # the other group of step 1 trained
    failures = [a for a in alerts if a.kind == "judge_failures"]
    assert len(failures) == 1 and failures[0].step == 2 and failures[0].evidence["dropped_groups"] == 1


@pytest.mark.asyncio
async def test_the_step_keeps_why_judge_calls_were_retried(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    # step 1's two groups meet these three failures in whichever order their calls come; then every call is answered.
    # Three retries: one group may meet all three and still be scored
    script = [Behaviour(status=503), Behaviour(body="not json"), Behaviour(status=429)]
    with judge_server(script) as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path, judge_max_retries=3))
    assert job.status is JobStatus.succeeded
    first, *later = step_metrics(engine, job_id)
    retries = {kind: first[f"judge_retries_{kind}"] for kind in RETRY_KINDS}
    assert retries == {"timeout": 0, "rate_limited": 1, "server_error": 1, "malformed": 1}
    assert first["judge_dropped_groups"] == 0 and all(m["judge_retries_server_error"] == 0 for m in later)
    with Session(engine) as session:
        totals = runs.judge_totals(session, job_id=job_id)
    assert {kind: totals[f"judge_retries_{kind}"] for kind in RETRY_KINDS} == retries


def test_the_judge_account_has_a_retry_count_for_every_kind():
    counted = {name.removeprefix("judge_retries_") for name in JudgeAccount.model_fields if name.startswith("judge_retries_")}
    assert counted == set(RETRY_KINDS)


@pytest.mark.asyncio
async def test_a_judge_that_is_down_stops_the_job_with_the_reason(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    with judge_server([Behaviour(status=503)] * 100) as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    assert job.status is JobStatus.failed and job.stop_reason is StopReason.error
    assert "the judge scored none of step 1's groups in 3 tries" in job.error and "ServiceUnavailableError" in job.error
    assert _history(engine, job_id)[0] == []


@pytest.mark.asyncio
async def test_a_step_the_judge_failed_whole_is_tried_again_and_counts_every_try(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    with judge_server([Behaviour(status=401), Behaviour(status=401)]) as server:  # both groups of the first try
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    assert job.status is JobStatus.succeeded and job.step == 4
    first = step_metrics(engine, job_id)[0]
    assert (first["judge_groups"], first["judge_dropped_groups"], first["judge_responses"]) == (4, 2, 2)


@pytest.mark.asyncio
async def test_the_judge_budget_stops_the_job(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged(max_judge_cost_usd=1e-6))
    with judge_server() as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.budget and job.step == 1
    assert step_metrics(engine, job_id)[0]["judge_cost_usd"] >= 1e-6


@pytest.mark.asyncio
async def test_a_ruler_job_stops_when_the_mean_ruler_reward_plateaus(tmp_path):
    engine = _new_store(tmp_path)
    spec = judged("ruler")
    spec["training"] = {**spec["training"], "max_steps": 50}
    spec["validation"] = {**spec["validation"], "every_n_steps": 1, "patience": 2, "min_delta": 0.5}
    job_id = _submit(engine, spec)
    with judge_server(scorer=lambda text: 0.5) as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.plateau and job.step == 3
    steps, points = _history(engine, job_id)
    assert [p[0] for p in points] == [1, 2, 3]  # no ground truth, so no step-0 point
    assert [p[1] for p in points] == [s[1] for s in steps] == [0.5, 0.5, 0.5] and all(p[2] is None for p in points)


@pytest.mark.asyncio
async def test_a_judge_the_operator_does_not_allow_fails_the_job_before_it_trains(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, judged())
    with judge_server() as server, pytest.raises(JudgeNotAllowed):
        await train(engine, job_id, tmp_path, settings_for(server, tmp_path, judge_models=["openai/other"]))
    assert server.requests == []
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
    assert job.status is JobStatus.failed and "'openai/gpt-4o-mini' is not a judge this server allows" in job.error


EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}",
         "reference": "Final: {{item.expected_answer}}", "operation": "eq"}  # fmt: skip


@pytest.mark.asyncio
async def test_a_grader_job_trains_on_the_grader_s_rewards(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, {**TINY_RUN, "reward": {"mode": "grader", "grader": EXACT}})
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=Settings(data_dir=tmp_path / "data"))
    assert job.status is JobStatus.succeeded and job.step == 4
    metrics = step_metrics(engine, job_id)
    assert all(m["judge_groups"] == 2 and m["judge_dropped_groups"] == 0 and m["judge_cost_usd"] == 0 for m in metrics)
    with Session(engine) as session:
        rows = session.exec(select(SampledTrajectory).where(SampledTrajectory.job_id == job_id, SampledTrajectory.split == "train")).all()
    expected = {row["id"]: row["expected_answer"] for row in environments.load("math").scenarios("train")}
    assert rows and all(r.details["metrics"]["grader_reward"] == r.reward for r in rows)
    assert all(r.reward == float(r.messages[-1]["content"] == f"Final: {expected[r.scenario_id]}") for r in rows)


@pytest.mark.asyncio
async def test_a_model_grader_names_only_judges_the_operator_allows(tmp_path):
    scored = {"type": "score_model", "name": "judge", "model": "openai/o3", "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    engine = _new_store(tmp_path)
    job_id = _submit(engine, {**TINY_RUN, "reward": {"mode": "grader", "grader": scored}})
    with pytest.raises(JudgeNotAllowed, match="openai/o3"):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=Settings(data_dir=tmp_path / "data"))


@pytest.mark.asyncio
async def test_a_job_with_a_target_gain_stops_once_validation_is_that_far_above_its_first_point(tmp_path):
    engine = _new_store(tmp_path)
    spec = judged("ruler")
    spec["training"] = {**spec["training"], "max_steps": 50}
    spec["validation"] = {**spec["validation"], "every_n_steps": 1, "target_gain": 0.3}
    job_id = _submit(engine, spec)
    scored = iter(range(1, 10_000))  # each trajectory judged scores a little more than the one before it
    with judge_server(scorer=lambda text: min(1.0, next(scored) / 100)) as server:
        job = await train(engine, job_id, tmp_path, settings_for(server, tmp_path))
    _, points = _history(engine, job_id)
    first, *between, last = [p[1] for p in points]
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.target, points
    assert last >= first + 0.3 > max(between, default=0.0) and len(between) >= 1, points
    assert job.step == points[-1][0] < 50
