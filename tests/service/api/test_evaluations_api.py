"""The evaluation and comparison endpoints, and job manifests, over HTTP on the real app and store."""

from __future__ import annotations

import pytest

from service.evaluation.runner import run_evaluation
from service.settings import Settings
from service.store.tables import Role
from tests.databases import sqlite_only
from tests.service.api.seeding import finish, new_job, principal
from tests.service.policy_server import policy_server


@pytest.fixture
def settings(database_url, tmp_path) -> Settings:
    with policy_server() as api_base:
        yield Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data",
                       baseline_models=["openai/sloppy", "openai/oracle"], baseline_api_base=api_base)  # fmt: skip


def test_a_job_has_its_manifest_from_submission(client, auth):
    headers = auth()
    job = client.post("/v1/jobs", json={"environment": "math", "validation": {"max_examples": 50}}, headers=headers).json()
    manifest = client.get(f"/v1/jobs/{job['id']}/manifest", headers=headers).json()
    locked = manifest["locked"]
    assert locked["split"] == "val" and locked["examples"] == 50 and locked["scorer"] == "math_strict"
    assert locked["split_fingerprint"].startswith("sha256:") and locked["prompt_hash"].startswith("sha256:")
    assert set(manifest["fingerprints"]) == {"train", "val", "test"}
    assert manifest["model"]["base_model"] and manifest["seed"] == 0 and manifest["code_version"]
    assert client.get(f"/v1/jobs/{job['id']}/manifest", headers=auth()).status_code == 404  # another client's


@pytest.mark.asyncio
@sqlite_only
async def test_evaluations_are_queued_run_and_read_back_with_results_and_compared(client, auth, engine, settings):
    headers = auth()
    body = {"model": {"litellm": "openai/sloppy"}, "environment": "math", "max_examples": 40}
    created = client.post("/v1/evaluations", json=body, headers=headers)
    assert created.status_code == 201, created.text
    evaluation = created.json()
    assert evaluation["status"] == "queued" and evaluation["summary"] is None
    oracle = client.post("/v1/evaluations", json={**body, "model": {"litellm": "openai/oracle"}}, headers=headers).json()
    for ev in (evaluation, oracle):  # what a worker does with a claimed evaluation
        await run_evaluation(ev["id"], db=engine, data_dir=settings.data_dir, settings=settings)

    done = client.get(f"/v1/evaluations/{evaluation['id']}", headers=headers).json()
    assert done["status"] == "succeeded" and done["summary"]["examples"] == 40
    assert [e["id"] for e in client.get("/v1/evaluations", headers=headers).json()["data"]] == [oracle["id"], evaluation["id"]]
    assert client.get("/v1/jobs", headers=headers).json()["data"] == []  # evaluations are not training jobs
    wrong = client.get(f"/v1/evaluations/{evaluation['id']}/results", params={"outcome": "wrong_answer"}, headers=headers)
    assert wrong.json()["data"] and all(r["outcome"] == "wrong_answer" and not r["correct"] for r in wrong.json()["data"])
    assert client.get(f"/v1/jobs/{evaluation['id']}/manifest", headers=headers).json()["kind"] == "evaluation"

    verdict = client.get("/v1/compare", params={"baseline": evaluation["id"], "candidate": oracle["id"], "min_delta": 0.05},
                         headers=headers).json()  # fmt: skip
    assert verdict["decision"] == "ACCEPT" and verdict["overall"]["candidate"] == 1.0
    moved = verdict["overall"]  # every example the oracle gains is counted, none lost
    assert moved["baseline_only"] == 0 and moved["candidate_only"] == round(moved["delta"] * 40) > 0
    assert client.get("/v1/compare", params={"baseline": "x" * 65, "candidate": oracle["id"]},
                      headers=headers).status_code == 422  # fmt: skip
    assert {row["outcome"] for row in verdict["outcomes"]} == {"correct", "wrong_answer"}
    other = client.get("/v1/compare", params={"baseline": evaluation["id"], "candidate": oracle["id"]}, headers=auth())
    assert other.status_code == 404  # another client sees neither


@sqlite_only
def test_evaluation_requests_are_checked_before_they_are_queued(client, engine, settings):
    owner_id, headers = principal(engine)
    refused = client.post("/v1/evaluations", json={"model": {"litellm": "openai/gpt-4o"}, "environment": "math"}, headers=headers)
    assert refused.status_code == 422 and "not a baseline model this server allows" in refused.text
    no_env = client.post("/v1/evaluations", json={"model": {"litellm": "openai/oracle"}}, headers=headers)
    assert no_env.status_code == 422 and "environment is required" in no_env.text
    bad_k = client.post("/v1/evaluations", json={"model": {"litellm": "openai/oracle"}, "environment": "math", "n": 2, "ks": [3]},
                        headers=headers)  # fmt: skip
    assert bad_k.status_code == 422
    running = new_job(engine, owner_id=owner_id)
    assert client.post("/v1/evaluations", json={"model": {"job_id": running}}, headers=headers).status_code == 409
    finish(engine, running)
    accepted = client.post("/v1/evaluations", json={"model": {"job_id": running}}, headers=headers)
    assert accepted.status_code == 201 and accepted.json()["environment"] == "math"
    _, stranger = principal(engine, Role.client, name="stranger")
    assert client.post("/v1/evaluations", json={"model": {"job_id": running}}, headers=stranger).status_code == 404
    assert client.get(f"/v1/evaluations/{running}", headers=headers).status_code == 404  # a training job is no evaluation
    queued = accepted.json()["id"]
    cancelled = client.post(f"/v1/evaluations/{queued}/cancel", headers=headers)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = client.post(f"/v1/evaluations/{queued}/cancel", headers=headers)
    assert again.status_code == 409 and "evaluation" in again.json()["detail"]
    assert client.post(f"/v1/evaluations/{queued}/cancel", headers=stranger).status_code == 404


@sqlite_only
def test_a_job_naming_a_baseline_the_operator_does_not_allow_is_refused(client, auth):
    spec = {"environment": "math", "validation": {"baseline_model": "openai/gpt-4o", "beat_baseline_by": 0.05}}
    response = client.post("/v1/jobs", json=spec, headers=auth())
    assert response.status_code == 422 and "validation.baseline_model" in response.text
