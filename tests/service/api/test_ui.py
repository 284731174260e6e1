"""The dashboard's pages over HTTP: what they show, model output escaped, who sees what, and the login cookie."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.app import create_app
from service.settings import Settings
from service.store import runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import Job, Role
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.conftest import LOCAL_URL

SCRIPT = "<script>alert('pwned')</script>"
OWN_PAGE = {"Origin": "http://testserver"}  # what a browser sends with a form from the TestClient's pages
MANIFEST = {"manifest_version": 1, "locked": {"split": "val", "examples": 8, "environment_args": {}},
            "model": {"base_model": "embedded/char-gpt-0.2m"}, "seed": 7}  # fmt: skip


def trained_job(engine, owner_id: str) -> str:
    """A running job with steps 1-2, validation at 0 and 2 (outcomes and per-example rows), an alert, a manifest,
    and a sampled rollout whose model output is a script tag."""
    job_id = seeding.new_job(engine, owner_id=owner_id)
    seeding.start(engine, job_id)
    seeding.record(engine, job_id, 0, accuracy=0.25)
    seeding.record(engine, job_id, 1, reward=0.3)
    seeding.alert(engine, job_id, kind="kl_spike", step=1)
    with Session(engine) as session:
        job = session.get(Job, job_id)
        values = dict(reward_mean=0.6, reward_std=0.1, groups=2, zero_variance_groups=0, completion_length=5.0,
                      wall_time_s=0.1, metrics={"tokens_generated": 120, "rollout_s": 1.5})  # fmt: skip
        runs.record_step(session, job=job, step=2, values=StepCreate(**values))
        runs.record_validation(session, job=job, step=2, values=ValidationCreate(
            accuracy=0.5, examples=4, temperature=1.0, wall_time_s=0.2, tokens_generated=40,
            outcomes={"correct": 2, "wrong_answer": 1, "missing_prefix": 1}))  # fmt: skip
        runs.record_example_results(session, job=job, step=2, rows=[
            dict(position=0, scenario_id="val-0", outcome="correct", correct=True, reward=1.0, completion="Final: 4"),
            dict(position=1, scenario_id="val-1", outcome="wrong_answer", correct=False, reward=0.0,
                 completion="Final: 5"),
            dict(position=2, scenario_id="val-2", outcome="missing_prefix", correct=False, reward=0.0,
                 completion=SCRIPT),
            dict(position=3, scenario_id="val-3", outcome="correct", correct=True, reward=1.0, completion="Final: 9"),
        ])  # fmt: skip
        messages = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": SCRIPT},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "<b>"}'}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "found"}]  # fmt: skip
        runs.record_trajectories(session, job=job, step=2, split="train", rows=[
            dict(group_index=0, scenario_id="train-17", reward=0.0, messages=messages, details={})])  # fmt: skip
        job.step, job.manifest = 2, MANIFEST
        session.add(job)
        session.commit()
    return job_id


@sqlite_only
def test_the_jobs_page_lists_the_owners_jobs_with_a_sparkline(client, engine):
    owner, headers = seeding.principal(engine, name="owner")
    job_id = trained_job(engine, owner)
    other_owner, _ = seeding.principal(engine, name="other")
    foreign = seeding.new_job(engine, owner_id=other_owner)
    page = client.get("/ui", headers=headers)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'href="/ui/jobs/{job_id}"' in page.text and foreign not in page.text
    assert "<svg" in page.text and '<polyline class="val"' in page.text and '<polyline class="reward"' in page.text
    assert "script-src 'nonce-" in page.headers["content-security-policy"]
    _, operator = seeding.principal(engine, role=Role.operator, name="operator")
    assert foreign in client.get("/ui", headers=operator).text  # operators see every job
    assert client.get("/ui?cursor=not-ours", headers=headers).status_code == 400


@sqlite_only
def test_the_job_page_shows_every_section_with_model_output_escaped(client, engine):
    owner, headers = seeding.principal(engine, name="owner")
    job_id = trained_job(engine, owner)
    page = client.get(f"/ui/jobs/{job_id}", headers=headers)
    assert page.status_code == 200, page.text
    text = page.text
    assert SCRIPT not in text and "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in text
    assert '<script nonce="' in text and text.count("<script") == 1  # the page's own script, nothing else
    assert 'id="step">2<' in text and f'src="/v1/jobs/{job_id}/curves.png?step=2"' in text
    for section in ('id="alerts"', 'id="failures"', 'id="manifest"', 'id="cost"', 'id="rollouts"', 'id="live-log"'):
        assert section in text
    assert "kl_spike" in text and "wrong_answer" in text and "missing_prefix" in text and "Final: 5" in text
    assert "Final: 4" not in text  # completions are shown for failing outcomes only
    assert "split_fingerprint" not in text and "<td>split</td>" in text and "base_model" in text  # locked table + JSON
    assert "train-17" in text and "lookup" in text and "&lt;b&gt;" in text and "What is 2 + 2?" in text
    assert "policy tokens, training" in text and "120" in text
    assert "new EventSource(" in text and 'data-after="' in text  # live: follows the stream from the newest event


@sqlite_only
def test_a_job_without_a_manifest_or_steps_says_so(client, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    text = client.get(f"/ui/jobs/{job_id}", headers=headers).text
    assert "Not written yet" in text and "No validation point yet" in text and "No rollouts recorded yet" in text


@sqlite_only
def test_another_clients_job_is_not_found(client, engine):
    owner, _ = seeding.principal(engine, name="owner")
    job_id = seeding.new_job(engine, owner_id=owner)
    _, stranger = seeding.principal(engine, name="stranger")
    assert client.get(f"/ui/jobs/{job_id}", headers=stranger).status_code == 404
    assert client.get("/ui/jobs/not-a-uuid", headers=stranger).status_code == 404


@sqlite_only
def test_without_a_token_the_pages_redirect_to_the_login_form(client, engine):
    job_id = seeding.new_job(engine, owner_id="someone")
    for path in ("/ui", f"/ui/jobs/{job_id}"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == f"/ui/login?next={path}"
    form = client.get("/ui/login")
    assert form.status_code == 200 and 'name="token"' in form.text


@sqlite_only
def test_the_login_form_sets_a_cookie_that_authorizes_the_api_and_the_pages(client, engine):
    owner, headers = seeding.principal(engine, name="owner")
    job_id = seeding.new_job(engine, owner_id=owner)
    token = headers["Authorization"].removeprefix("Bearer ")
    assert client.get("/v1/jobs").status_code == 401
    response = client.post("/ui/login", data={"token": token, "next": f"/ui/jobs/{job_id}"}, headers=OWN_PAGE,
                           follow_redirects=False)  # fmt: skip
    assert response.status_code == 303 and response.headers["location"] == f"/ui/jobs/{job_id}"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("artsvc_session=") and token not in cookie  # a session of its own (test_browser_sessions)
    listed = client.get("/v1/jobs")
    assert listed.status_code == 200 and [job["id"] for job in listed.json()["data"]] == [job_id]
    assert client.get(f"/ui/jobs/{job_id}").status_code == 200
    # a header, even a wrong one, wins over the cookie: bearer behaviour is unchanged
    assert client.get("/v1/jobs", headers={"Authorization": "Basic eDp5"}).status_code == 401
    logout = client.post("/ui/logout", headers=OWN_PAGE, follow_redirects=False)
    assert logout.status_code == 303 and 'artsvc_session=""' in logout.headers["set-cookie"]
    assert client.get("/v1/jobs").status_code == 401


@sqlite_only
def test_a_bad_token_in_the_form_is_refused_without_a_cookie(client, engine):
    response = client.post("/ui/login", data={"token": "artsvc_not-a-token", "next": "/ui"}, headers=OWN_PAGE,
                           follow_redirects=False)  # fmt: skip
    assert response.status_code == 401 and "unknown or revoked token" in response.text
    assert "set-cookie" not in response.headers
    assert client.get("/ui", follow_redirects=False).status_code == 303


@sqlite_only
@pytest.mark.parametrize("target", ["//evil.example/ui", "https://evil.example/", "/v1/jobs", "/ui/../x"])
def test_the_login_only_returns_to_dashboard_pages(client, engine, target):
    _, headers = seeding.principal(engine)
    token = headers["Authorization"].removeprefix("Bearer ")
    response = client.post("/ui/login", data={"token": token, "next": target}, headers=OWN_PAGE, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui"


@sqlite_only
@pytest.mark.parametrize(
    "headers", [{"Origin": "https://evil.example"}, {"Origin": "http://testserver:8001"}, {"Origin": "null"}, {}]
)
def test_a_login_posted_from_another_site_or_from_nowhere_is_refused(client, engine, headers):
    _, bearer = seeding.principal(engine)
    token = bearer["Authorization"].removeprefix("Bearer ")
    response = client.post("/ui/login", data={"token": token}, headers=headers)
    assert response.status_code == 403 and "set-cookie" not in response.headers
    referred = client.post("/ui/login", data={"token": token}, headers={"Referer": "http://testserver/ui/login"},
                           follow_redirects=False)  # fmt: skip
    assert referred.status_code == 303 and "set-cookie" in referred.headers  # no Origin: the Referer decides


@sqlite_only
def test_local_mode_needs_no_login(engine, database_url, tmp_path):
    settings = Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data", local_mode=True)
    job_id = seeding.new_job(engine, owner_id="local")
    with TestClient(create_app(settings, engine=engine), base_url=LOCAL_URL) as client:
        assert f"/ui/jobs/{job_id}" in client.get("/ui").text
        assert client.get(f"/ui/jobs/{job_id}").status_code == 200
        response = client.get("/ui/login", follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/ui"
