"""Bearer-token auth: no or bad token 401, clients see only their own jobs, operators see and cancel all."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from service.app import create_app
from service.store import runs
from service.store.tables import LOCAL_OWNER, ApiToken, Role, utcnow
from tests.databases import sqlite_only
from tests.service.conftest import LOCAL_URL

pytestmark = sqlite_only  # plain HTTP behaviour: nothing here depends on the database

JOB_ROUTES = [
    ("get", "/v1/jobs/{id}"),
    ("post", "/v1/jobs/{id}/cancel"),
    ("get", "/v1/jobs/{id}/metrics"),
    ("get", "/v1/jobs/{id}/trajectories"),
]


def submit(client, headers) -> str:
    response = client.post("/v1/jobs", json={"environment": "math"}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.parametrize(("method", "path"), [("get", "/v1/jobs"), ("post", "/v1/jobs"), *JOB_ROUTES])
@pytest.mark.parametrize(
    ("authorization", "message"),
    [
        (None, "missing bearer token"),
        ("Bearer artsvc_not-a-real-token", "unknown or revoked token"),
        ("Basic dTpw", "missing bearer token"),
    ],
)
def test_requests_without_a_valid_token_are_401(client, method, path, authorization, message):
    headers = {"Authorization": authorization} if authorization else {}
    response = client.request(method, path.format(id="00000000-0000-4000-8000-000000000000"), headers=headers, json={})
    assert response.status_code == 401
    assert message in response.json()["detail"] and response.headers["WWW-Authenticate"] == "Bearer"


def test_a_revoked_token_is_refused(client, auth, engine):
    headers = auth(name="to-revoke")
    assert client.get("/v1/jobs", headers=headers).status_code == 200
    with Session(engine) as session:
        token = session.exec(select(ApiToken).where(ApiToken.name == "to-revoke")).one()
        token.revoked_at = utcnow()
        session.add(token)
        session.commit()
    assert client.get("/v1/jobs", headers=headers).status_code == 401


def test_a_client_sees_only_its_own_jobs(client, auth):
    alice, bob = auth(name="alice"), auth(name="bob")
    alices = submit(client, alice)
    bobs = submit(client, bob)
    assert [job["id"] for job in client.get("/v1/jobs", headers=alice).json()["data"]] == [alices]
    assert [job["id"] for job in client.get("/v1/jobs", headers=bob).json()["data"]] == [bobs]
    for method, path in JOB_ROUTES:
        response = client.request(method, path.format(id=alices), headers=bob)
        assert response.status_code == 404, (method, path)
        assert response.json()["detail"] == f"no job {alices!r}"  # exactly what a missing job says
    assert client.get(f"/v1/jobs/{alices}", headers=alice).json()["status"] == "queued"  # bob's cancel did nothing


def test_an_operator_sees_every_job_and_cancels_any(client, auth):
    alice, operator = auth(name="alice"), auth(Role.operator, name="ops")
    alices = submit(client, alice)
    mine = submit(client, operator)
    assert {job["id"] for job in client.get("/v1/jobs", headers=operator).json()["data"]} == {alices, mine}
    assert client.get(f"/v1/jobs/{alices}/metrics", headers=operator).status_code == 200
    cancelled = client.post(f"/v1/jobs/{alices}/cancel", headers=operator).json()
    assert cancelled["status"] == "cancelled"
    assert client.get(f"/v1/jobs/{alices}", headers=alice).json()["stop_reason"] == "cancelled"


def test_local_mode_needs_no_token_and_acts_as_the_operator(settings, engine, client, auth):
    alices = submit(client, auth(name="alice"))
    local = settings.model_copy(update={"local_mode": True})
    with TestClient(create_app(local, engine=engine), base_url=LOCAL_URL) as local_client:
        mine = submit(local_client, {})
        assert {job["id"] for job in local_client.get("/v1/jobs").json()["data"]} == {alices, mine}
        assert local_client.post(f"/v1/jobs/{alices}/cancel").json()["status"] == "cancelled"
    with Session(engine) as session:
        assert runs.get_job(session, job_id=mine).owner_id == LOCAL_OWNER
