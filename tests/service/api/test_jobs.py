"""The jobs resource on SQLite and PostgreSQL: submit, idempotent retries, list pages, cancel, metrics, rollouts."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlmodel import Session, select

from service.store import events, runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import BASE_STEP, ApiToken, JobKind, Role, utcnow
from tests.databases import sqlite_only

JOB_FIELDS = {
    "id", "status", "environment", "spec", "step", "step0_val_accuracy", "best_val_accuracy", "best_step",
    "stop_reason", "error", "created_at", "started_at", "finished_at",
} | {"cancel_requested", "base_val_accuracy"}  # DESIGN.md's fields, then this service's additions  # fmt: skip
MATH = {"environment": "math"}
TINY_LONG_JOB = {  # the tiny model, many steps: still running when the test cancels it
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {"warm_start_examples": 0, "max_steps": 100, "groups_per_step": 1, "group_size": 2},
    "validation": {"every_n_steps": 100, "max_examples": 2},
}


def submit(client, headers, spec=MATH, **extra):
    response = client.post("/v1/jobs", json=spec, headers={**headers, **extra})
    assert response.status_code == 201, response.text
    return response


def test_math_alone_is_a_queued_job_with_the_design_shape(client, auth):
    headers = auth()
    job = submit(client, headers).json()
    assert set(job) == JOB_FIELDS
    assert job["status"] == "queued" and job["environment"] == "math" and job["step"] == 0
    assert job["spec"]["training"]["group_size"] == 8 and job["spec"]["validation"]["every_n_steps"] == 4  # defaults
    assert job["created_at"].endswith("Z") or job["created_at"].endswith("+00:00")
    assert client.get(f"/v1/jobs/{job['id']}", headers=headers).json() == job


def test_an_agents_job_gets_its_environments_settings_for_a_pretrained_model_where_it_sets_none(client, auth):
    """2048 recommends smaller steps and validations than math's defaults (environments' ``pretrained_job``); what the
    caller sets is its own, and a job that spells out the spec's default differs from one that sets nothing."""
    import environments

    headers = auth()
    recommended = environments.load("2048").pretrained_job
    job = submit(client, headers, {"environment": "2048", "validation": {"patience": 5}}, **{"Idempotency-Key": "a"})
    spec = job.json()["spec"]
    assert {k: spec["training"][k] for k in recommended["training"]} == dict(recommended["training"])
    assert {k: spec["validation"][k] for k in recommended["validation"]} == dict(recommended["validation"])
    assert spec["validation"]["patience"] == 5
    assert recommended["training"]["groups_per_step"] != 8
    explicit = {"environment": "2048", "training": {"groups_per_step": 8}, "validation": {"patience": 5}}
    response = client.post("/v1/jobs", json=explicit, headers={**headers, "Idempotency-Key": "a"})
    assert response.status_code == 409  # another job than the key's
    embedded = submit(client, headers, {"environment": "2048", "model": {"backend": "embedded"}}).json()["spec"]
    assert embedded["training"]["groups_per_step"] == 8  # a policy trained from scratch: the spec's defaults


def test_a_retry_with_the_same_idempotency_key_returns_the_same_job(client, auth):
    headers = auth()
    first = submit(client, headers, **{"Idempotency-Key": "retry-1"})
    again = submit(client, headers, **{"Idempotency-Key": "retry-1"})
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    # spelling the defaults out asks for the same job
    explicit = {"environment": "math", "training": {"group_size": 8}, "seed": 0}
    assert submit(client, headers, explicit, **{"Idempotency-Key": "retry-1"}).json()["id"] == first.json()["id"]
    assert len(client.get("/v1/jobs", headers=headers).json()["data"]) == 1


def test_the_same_key_with_a_different_spec_is_a_conflict(client, auth):
    headers = {**auth(), "Idempotency-Key": "k"}
    submit(client, headers)
    response = client.post("/v1/jobs", json={"environment": "math", "seed": 1}, headers=headers)
    assert response.status_code == 409
    assert "already used with a different job spec" in response.json()["detail"]


def test_idempotency_keys_belong_to_their_token(client, auth):
    key = {"Idempotency-Key": "shared"}
    mine, theirs = submit(client, auth(), **key).json(), submit(client, auth(), **key).json()
    assert mine["id"] != theirs["id"]


def test_concurrent_retries_make_one_job(live_server, auth):
    headers = {**auth(), "Idempotency-Key": "burst"}

    def post(_):
        return httpx.post(f"{live_server}/v1/jobs", json=MATH, headers=headers, timeout=60)

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(8)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 7
    listed = httpx.get(f"{live_server}/v1/jobs", headers=headers).json()["data"]
    assert [job["id"] for job in listed] == [responses[0].json()["id"]]


def test_jobs_are_listed_newest_first_in_pages_and_filtered_by_status(client, auth):
    headers = auth()
    made = [submit(client, headers, {"environment": "math", "seed": seed}).json()["id"] for seed in range(5)]
    for job_id in made[:2]:
        assert client.post(f"/v1/jobs/{job_id}/cancel", headers=headers).status_code == 200

    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/jobs", params=params, headers=headers).json()
        seen += [job["id"] for job in page["data"]]
        pages += 1
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == made[::-1] and pages == 3

    def ids(status):
        return [job["id"] for job in client.get("/v1/jobs", params={"status": status}, headers=headers).json()["data"]]

    assert ids("cancelled") == made[1::-1]
    assert ids("queued") == made[:1:-1]
    assert ids("running") == []


def test_cancelling_a_queued_job_ends_it_and_a_second_cancel_is_a_conflict(client, auth, engine):
    headers = auth()
    job_id = submit(client, headers).json()["id"]
    job = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers).json()
    assert (job["status"], job["stop_reason"], job["cancel_requested"]) == ("cancelled", "cancelled", True)
    assert job["finished_at"] is not None
    again = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["detail"]
    with Session(engine) as session:
        kinds = [event.kind for event in events.events_after(session, job_id=job_id)]
    assert kinds == ["queued", "finished"]


def test_cancelling_a_running_job_flags_it_once(client, auth, engine):
    headers = auth()
    job_id = submit(client, headers).json()["id"]
    with Session(engine) as session:
        runs.mark_running(session, job=runs.get_job(session, job_id=job_id))
        session.commit()
    for _ in range(2):  # asking twice is the same request
        job = client.post(f"/v1/jobs/{job_id}/cancel", headers=headers).json()
        assert (job["status"], job["cancel_requested"], job["stop_reason"]) == ("running", True, None)
    with Session(engine) as session:
        kinds = [event.kind for event in events.events_after(session, job_id=job_id)]
    assert kinds == ["queued", "started", "cancel_requested"]


@pytest.mark.timeout(600)
def test_a_running_job_stops_at_a_step_boundary_when_cancelled(client, auth, start_worker):
    headers = auth()
    job_id = submit(client, headers, TINY_LONG_JOB).json()["id"]
    start_worker()
    wait_until(lambda: client.get(f"/v1/jobs/{job_id}", headers=headers).json()["step"] >= 1, "a first step")
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=headers).json()["cancel_requested"] is True
    ended = wait_until(lambda: ended_job(client, headers, job_id), "the job to stop")
    assert (ended["status"], ended["stop_reason"]) == ("cancelled", "cancelled")
    assert ended["step"] < TINY_LONG_JOB["training"]["max_steps"]
    steps = [row["step"] for row in client.get(f"/v1/jobs/{job_id}/metrics", headers=headers).json()["steps"]]
    assert steps == list(range(1, ended["step"] + 1))  # every step it took is recorded, none after the stop


def ended_job(client, headers, job_id):
    job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    return job if job["finished_at"] else None


def wait_until(check, what: str, *, timeout: float = 300):
    """Poll ``check`` until it is truthy; the timeout guards against a hang, it measures nothing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout}s")


def test_metrics_hold_every_step_and_validation_point(client, auth, engine):
    headers = auth()
    job_id = submit(client, headers).json()["id"]
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        runs.record_validation(session, job=job, step=0, values=ValidationCreate(**validation(0.25)))
        for step in (1, 2):
            runs.record_step(session, job=job, step=step, values=StepCreate(**training_step(step)))
        runs.record_validation(session, job=job, step=2, values=ValidationCreate(**validation(0.5)))
        session.commit()
    metrics = client.get(f"/v1/jobs/{job_id}/metrics", headers=headers).json()
    assert [row["step"] for row in metrics["steps"]] == [1, 2]
    assert metrics["steps"][1]["reward_mean"] == 0.2 and metrics["steps"][1]["metrics"] == {"policy_loss": 0.5}
    assert {"reward_std", "zero_variance_groups", "kl", "entropy", "loss", "wall_time_s"} <= set(metrics["steps"][0])
    assert [(row["step"], row["accuracy"]) for row in metrics["validation"]] == [(0, 0.25), (2, 0.5)]
    assert metrics["validation"][0]["outcomes"] == {"correct": 2, "wrong": 6}
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).json()["step"] == 2


def test_the_base_models_point_leads_the_metrics_and_stays_out_of_the_stopping_series(client, auth, engine):
    headers = auth()
    job_id = submit(client, headers).json()["id"]
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        runs.record_validation(session, job=job, step=BASE_STEP, values=ValidationCreate(**validation(0.75)))
        zero = runs.record_validation(session, job=job, step=0, values=ValidationCreate(**validation(0.25)))
        session.commit()
        assert (zero.best_step, zero.best_accuracy, zero.anchor_accuracy) == (0, 0.25, 0.25)  # not the base's 0.75
    metrics = client.get(f"/v1/jobs/{job_id}/metrics", headers=headers).json()
    assert [(row["step"], row["accuracy"]) for row in metrics["validation"]] == [(BASE_STEP, 0.75), (0, 0.25)]
    curves = client.get(f"/v1/jobs/{job_id}/curves.png", headers=headers)
    assert curves.status_code == 200 and curves.content.startswith(b"\x89PNG")


def test_trajectories_are_filtered_by_step_and_split_and_limited(client, auth, engine):
    headers = auth()
    job_id = submit(client, headers).json()["id"]
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        for step, split in ((1, "train"), (2, "train"), (2, "val")):
            runs.record_trajectories(session, job=job, step=step, split=split, rows=[rollout(i) for i in range(3)])
        session.commit()

    def get(**params):
        return client.get(f"/v1/jobs/{job_id}/trajectories", params=params, headers=headers).json()["data"]

    everything = get()
    assert len(everything) == 9 and [row["step"] for row in everything] == [2] * 6 + [1] * 3
    assert {(row["step"], row["split"]) for row in get(step=2, split="val")} == {(2, "val")}
    assert len(get(step=1)) == 3 and len(get(limit=4)) == 4
    first = get(step=1, limit=1)[0]
    assert first["messages"][-1] == {"role": "assistant", "content": "4"}
    assert first["details"] == {"outcome": "correct"} and first["reward"] == 1.0


@sqlite_only
def test_an_unknown_job_is_404(client, auth):
    response = client.get("/v1/jobs/00000000-0000-4000-8000-000000000000", headers=auth(Role.operator))
    assert response.status_code == 404 and "no job" in response.json()["detail"]


def training_step(step: int) -> dict:
    return {"reward_mean": step / 10, "reward_std": 0.1, "groups": 2, "zero_variance_groups": 0, "loss": 0.5,
            "entropy": 1.0, "kl": 0.01, "completion_length": 3.0, "wall_time_s": 0.5,
            "metrics": {"policy_loss": 0.5}}  # fmt: skip


def validation(accuracy: float) -> dict:
    return {"accuracy": accuracy, "greedy_accuracy": accuracy, "examples": 8, "temperature": 1.0,
            "outcomes": {"correct": int(accuracy * 8), "wrong": 8 - int(accuracy * 8)}, "wall_time_s": 0.2}  # fmt: skip


def rollout(index: int) -> dict:
    messages = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    return {"group_index": index, "scenario_id": f"s{index}", "reward": 1.0, "messages": messages,
            "details": {"outcome": "correct"}}  # fmt: skip


def test_a_job_read_answers_for_its_token_and_owner_as_every_route_does(client, auth, engine):
    """GET /v1/jobs/{id} reads the bearer token and the job in one statement: a live token sees its own job (an
    operator's every job), another client's, a missing or a non-job id is 404 alike, a revoked or unknown token 401."""
    alice, bob, operator = auth(name="alice"), auth(name="bob"), auth(Role.operator, name="ops")
    alices = submit(client, alice).json()["id"]
    listed = client.get("/v1/jobs", headers=alice).json()["data"][0]
    assert client.get(f"/v1/jobs/{alices}", headers=alice).json() == listed
    assert client.get(f"/v1/jobs/{alices}", headers=operator).json() == listed
    for headers, job_id in ((bob, alices), (alice, "00000000-0000-4000-8000-000000000000"), (alice, "not-a-job")):
        response = client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert (response.status_code, response.json()["detail"]) == (404, f"no job {job_id!r}")
    with Session(engine) as session:
        job = runs.get_job(session, job_id=alices)
        job.kind = JobKind.evaluation  # an evaluation is not a training job: GET /v1/evaluations/{id} shows it
        session.add(job)
        session.commit()
    assert client.get(f"/v1/jobs/{alices}", headers=alice).status_code == 404
    with Session(engine) as session:
        token = session.exec(select(ApiToken).where(ApiToken.name == "alice")).one()
        token.revoked_at = utcnow()
        session.add(token)
        session.commit()
    for headers in (alice, {"Authorization": "Bearer artsvc_not-a-real-token"}):
        response = client.get(f"/v1/jobs/{alices}", headers=headers)
        assert (response.status_code, response.json()["detail"]) == (401, "unknown or revoked token")
