"""Submitting judged jobs: the operator's settings decide which judges a job may name."""

from __future__ import annotations

import pytest

from service.app import create_app
from tests.databases import sqlite_only

pytestmark = sqlite_only  # refusals at the API's door: nothing here depends on the database

ALLOWED = "openai/gpt-4o-mini"
SCORED = {"type": "score_model", "name": "judge", "model": ALLOWED, "input": [{"role": "user", "content": "{{sample.output_text}}"}]}


@pytest.fixture
def app(settings, engine):
    return create_app(settings.model_copy(update={"judge_models": [ALLOWED]}), engine=engine)


@pytest.mark.parametrize(
    "reward",
    [
        {"mode": "hybrid", "judge_model": ALLOWED},
        {"mode": "ruler", "judge_model": ALLOWED, "rubric": "Prefer short answers.", "max_judge_cost_usd": 2.5},
        {"mode": "grader", "grader": SCORED},
        {"mode": "grader", "grader": {"type": "string_check", "name": "x", "input": "{{sample.output_text}}",
                                      "reference": "{{item.answer}}", "operation": "eq"}},  # fmt: skip
    ],
)
def test_a_job_naming_an_allowed_judge_is_queued(client, auth, reward):
    response = client.post("/v1/jobs", json={"environment": "email", "reward": reward}, headers=auth())
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["reward"]["mode"] == reward["mode"]


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"mode": "hybrid", "judge_model": "openai/o3"}, "reward.judge_model: 'openai/o3' is not a judge this server allows; allowed: openai/gpt-4o-mini"),
        ({"mode": "grader", "grader": {**SCORED, "model": "anthropic/claude"}}, "reward.grader: model"),
        ({"mode": "hybrid"}, "reward.judge_model is required in hybrid mode"),
        ({"mode": "hybrid", "judge_model": "gpt-4o"}, "reward.judge_model"),
        ({"mode": "verifier", "judge_model": ALLOWED}, "apply to the ruler and hybrid modes only"),
        ({"mode": "grader"}, "reward.grader is required in grader mode"),
        ({"mode": "grader", "grader": {"type": "string_check", "name": "x"}}, "reward.grader: input"),
        ({"mode": "hybrid", "judge_model": ALLOWED, "max_judge_cost_usd": 0}, "max_judge_cost_usd"),
        ({"mode": "hybrid", "judge_model": ALLOWED, "api_base": "http://evil.example"}, "api_base"),
    ],
)
def test_a_job_naming_a_judge_or_endpoint_the_operator_did_not_allow_is_refused(client, auth, reward, message):
    response = client.post("/v1/jobs", json={"environment": "email", "reward": reward}, headers=auth())
    assert response.status_code == 422, response.text
    assert message in response.text
