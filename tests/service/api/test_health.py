"""/healthz and /metrics on SQLite and PostgreSQL: /healthz needs no token, /metrics an operator's or the metrics
token; worker liveness, an unreachable database, and Prometheus text that parses, counts what the store holds and
never names a job."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from service.app import create_app
from service.settings import Settings
from service.store import db as store_db
from service.store.tables import AlertState, JobStatus, Role
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.conftest import LOCAL_URL

UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"  # port 1: nothing listens there
LEASE_SECONDS = 60  # the default of Settings.lease_seconds
METRICS_TOKEN = "prometheus-scrape-secret"
SCRAPER = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@pytest.fixture
def settings(settings) -> Settings:
    return settings.model_copy(update={"metrics_token": SecretStr(METRICS_TOKEN)})


def samples(client: TestClient) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics by (name, labels), parsed as Prometheus parses it."""
    response = client.get("/metrics", headers=SCRAPER)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_with_no_live_worker_the_service_is_degraded(client, engine):
    seeding.worker(engine, "stopped", concurrency=4, running_jobs=0, stopped=True)
    seeding.worker(engine, "silent", concurrency=4, running_jobs=1, age_s=2 * LEASE_SECONDS + 30)
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "degraded", "database": {"ok": True, "error": None},
        "workers": {"alive": 0, "capacity": 0, "running_jobs": 0},
    }  # fmt: skip


def test_a_heartbeating_worker_makes_the_service_ok(client, engine):
    seeding.worker(engine, "fresh", concurrency=2, running_jobs=1, age_s=1)
    seeding.worker(engine, "recent", concurrency=3, running_jobs=0, age_s=LEASE_SECONDS)
    seeding.worker(engine, "silent", concurrency=4, running_jobs=1, age_s=2 * LEASE_SECONDS + 30)
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["workers"] == {"alive": 2, "capacity": 5, "running_jobs": 1}


@sqlite_only
def test_an_unreachable_database_is_503_and_metrics_say_so(app, client):
    for name in ("engine", "health_engine"):  # /healthz checks on a connection of its own
        getattr(app.state, name).dispose()
        setattr(app.state, name, store_db.make_engine(UNREACHABLE))
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["database"]["ok"] is False and body["workers"] is None
    assert "cannot reach the database" in body["database"]["error"] and "127.0.0.1" not in body["database"]["error"]
    assert samples(client)[("artsvc_store_up", frozenset())] == 0
    app.state.engine.dispose()
    app.state.health_engine.dispose()


def test_metrics_count_what_the_store_holds_without_naming_a_job(client, engine):
    owner, headers = seeding.principal(engine)
    for _ in range(2):
        seeding.new_job(engine, owner_id=owner)  # queued
    running, other, done = (seeding.new_job(engine, owner_id=owner) for _ in range(3))
    for job_id in (running, other, done):
        seeding.start(engine, job_id)
    for step, accuracy in ((0, 0.2), (1, None), (2, 0.5), (3, None), (4, 0.4)):
        seeding.record(engine, running, step, accuracy=accuracy)
    seeding.record(engine, other, 0, accuracy=0.8)
    seeding.record(engine, done, 1, accuracy=0.9)
    seeding.finish(engine, done)
    seeding.alert(engine, running, kind="divergence", step=4)
    seeding.alert(engine, done, kind="plateau", step=1, state=AlertState.acknowledged)
    seeding.worker(engine, "fresh", concurrency=1, running_jobs=1)

    found = samples(client)
    jobs = {status.value: found[("artsvc_jobs", frozenset({("kind", "training"), ("status", status.value)}))] for status in JobStatus}
    assert jobs == {"queued": 2, "running": 2, "succeeded": 1, "failed": 0, "cancelled": 0}
    assert found[("artsvc_jobs", frozenset({("kind", "evaluation"), ("status", "queued")}))] == 0
    assert found[("artsvc_training_steps_total", frozenset())] == 5
    math = frozenset({("environment", "math")})
    assert found[("artsvc_running_jobs_validated", math)] == 2  # the ended job is not counted
    assert found[("artsvc_validation_accuracy", math)] == pytest.approx(0.6)  # mean of the latest points, 0.4 and 0.8
    assert found[("artsvc_best_validation_accuracy", math)] == 0.8
    assert found[("artsvc_alerts", frozenset({("kind", "divergence"), ("state", "open")}))] == 1
    assert found[("artsvc_alerts", frozenset({("kind", "plateau"), ("state", "acknowledged")}))] == 1
    assert found[("artsvc_workers_alive", frozenset())] == 1
    assert found[("artsvc_store_up", frozenset())] == 1
    text = client.get("/metrics", headers=SCRAPER).text
    assert not [job_id for job_id in (running, other, done) if job_id in text] and "job_id" not in text
    assert owner not in text


@sqlite_only
def test_request_latency_is_labelled_by_route_template(client, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    for _ in range(3):
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    assert client.get("/v1/jobs/00000000-0000-4000-8000-000000000000", headers=headers).status_code == 404
    assert client.get(f"/no/such/path/{job_id}").status_code == 404

    found = samples(client)
    count = "artsvc_http_request_duration_seconds_count"
    labels = {"method": "GET", "route": "/v1/jobs/{job_id}"}
    assert found[(count, frozenset((labels | {"status": "200"}).items()))] == 3
    assert found[(count, frozenset((labels | {"status": "404"}).items()))] == 1
    assert found[(count, frozenset({"method": "GET", "route": "<unmatched>", "status": "404"}.items()))] == 1
    assert not [key for key in found if any(job_id in value for _, value in key[1])]  # no raw paths as labels


@sqlite_only
def test_each_app_keeps_its_own_metrics(settings, engine):
    first_app, second_app = create_app(settings, engine=engine), create_app(settings, engine=engine)
    with TestClient(first_app) as first, TestClient(second_app) as second:
        for _ in range(2):
            first.get("/healthz")
        second.get("/healthz")
        count = ("artsvc_http_request_duration_seconds_count",
                 frozenset({"method": "GET", "route": "/healthz", "status": "200"}.items()))  # fmt: skip
        assert samples(first)[count] == 2 and samples(second)[count] == 1


@sqlite_only
def test_health_needs_no_token(client):
    assert client.get("/healthz").status_code == 200


@sqlite_only
def test_metrics_are_for_operators_and_the_scraper(client, engine):
    without = client.get("/metrics")
    assert without.status_code == 401 and without.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/metrics", headers={"Authorization": "Bearer prometheus-scrape-guess"}).status_code == 401
    _, customer = seeding.principal(engine, name="client")
    refused = client.get("/metrics", headers=customer)
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    _, operator = seeding.principal(engine, role=Role.operator, name="operator")
    for headers in (operator, SCRAPER):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 200 and "artsvc_store_up 1.0" in response.text


@sqlite_only
def test_without_a_metrics_token_operators_still_scrape(engine, database_url, tmp_path):
    settings = Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data")
    _, operator = seeding.principal(engine, role=Role.operator)
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
        assert client.get("/metrics", headers=operator).status_code == 200


@sqlite_only
def test_local_mode_leaves_metrics_open(engine, database_url, tmp_path):
    settings = Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data", local_mode=True)
    with TestClient(create_app(settings, engine=engine), base_url=LOCAL_URL) as client:
        assert client.get("/metrics").status_code == 200
