"""``artsvc evaluate`` and ``artsvc compare`` as a user runs them: subprocesses against the real API on loopback, and a
worker process that runs the evaluations against a baseline model served on loopback."""

from __future__ import annotations

import json

import pytest

from service.settings import Settings
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.cli.test_plot import artsvc, said
from tests.service.policy_server import policy_server


@pytest.fixture
def settings(database_url, tmp_path) -> Settings:
    with policy_server() as api_base:
        yield Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data",
                       baseline_models=["openai/sloppy", "openai/oracle"], baseline_api_base=api_base)  # fmt: skip


@pytest.fixture(autouse=True)
def worker(settings, start_worker):
    """A worker process beside the API, as `artsvc serve` runs one, allowed the same baselines: evaluations get run."""
    models = ",".join(settings.baseline_models)
    return start_worker(ARTSVC_BASELINE_MODELS=models, ARTSVC_BASELINE_API_BASE=settings.baseline_api_base)


@sqlite_only
def test_evaluate_queues_and_compare_gates_with_its_exit_code(live_server, engine, tmp_path):
    _, headers = seeding.principal(engine)
    env = {"ARTSVC_API_URL": live_server, "ARTSVC_TOKEN": headers["Authorization"].removeprefix("Bearer ")}
    ids = {}
    for model in ("sloppy", "oracle"):
        spec = tmp_path / f"{model}.json"
        spec.write_text(
            json.dumps({"model": {"litellm": f"openai/{model}"}, "environment": "math", "max_examples": 30})
        )
        result = artsvc("evaluate", str(spec), "--wait", cwd=tmp_path, **env)  # the server's worker runs it
        assert result.returncode == 0, result.stderr
        ids[model] = result.stdout.splitlines()[-1]

    accepted = artsvc("compare", ids["sloppy"], ids["oracle"], "--min-delta", "0.05", "--json", cwd=tmp_path, **env)
    assert accepted.returncode == 0, accepted.stderr
    verdict = json.loads(accepted.stdout.splitlines()[-1])
    assert verdict["decision"] == "ACCEPT" and "ACCEPT" in said(accepted)
    moved = verdict["overall"]["candidate_only"]  # the examples that moved, as the accuracy line says them
    assert f"{moved} examples correct in the candidate only, 0 in the baseline only" in " ".join(said(accepted).split())
    rejected = artsvc("compare", ids["oracle"], ids["sloppy"], cwd=tmp_path, **env)
    assert rejected.returncode == 1 and "REJECT" in said(rejected) and "lower bound" in said(rejected)

    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"model": {"litellm": "openai/gpt-4o"}, "environment": "math"}))
    result = artsvc("evaluate", str(refused), cwd=tmp_path, **env)
    assert result.returncode == 2 and "not a baseline model this server allows" in said(result)


@sqlite_only
def test_evaluate_wait_follows_the_worker_to_the_summary(live_server, engine, tmp_path):
    _, headers = seeding.principal(engine)
    env = {"ARTSVC_API_URL": live_server, "ARTSVC_TOKEN": headers["Authorization"].removeprefix("Bearer ")}
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"model": {"litellm": "openai/sloppy"}, "environment": "math", "max_examples": 20, "n": 2})
    )
    result = artsvc("evaluate", str(spec), "--wait", "--json", cwd=tmp_path, **env)
    assert result.returncode == 0, result.stderr
    evaluation = json.loads(result.stdout.splitlines()[-1])
    assert evaluation["status"] == "succeeded" and evaluation["summary"]["examples"] == 20
    shown = said(result)
    assert "rollouts" in shown and "pass rate" in shown and "selection (best-of-N by reward)" in shown
    assert "wrong_answer" in shown  # the failure table
