"""Bad input never yields a 500: each gets a 4xx whose JSON ``detail`` names the problem."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient

from service.api.loop_reads import LoopReads
from service.app import create_app
from service.store import db as store_db
from service.store.tables import Role

from tests.databases import sqlite_only
from tests.service.conftest import MAX_BODY_BYTES

JSON = {"Content-Type": "application/json"}


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def math(**fields) -> str:
    """A math job's JSON with ``fields`` on top (NaN and Infinity are written as Python's json writes them)."""
    return json.dumps({"environment": "math", **fields})


BAD_SUBMISSIONS = [
    ('{"environment": "math"', 400, "body: malformed JSON at character"),
    ("", 422, "body: a JSON body is required"),
    ('["math"]', 422, "body: expected a JSON object"),
    ('{"environment": "chess"}', 422, "unknown environment 'chess'; installed: "),
    ('{"environment": ""}', 422, "environment: String should have at least 1 character"),
    (json.dumps({"environment": "m" * 65}), 422, "environment: String should have at most 64 characters"),
    ('{"model": {"name": "x"}}', 422, "environment: Field required"),
    ('{"environment": 7}', 422, "environment: Input should be a valid string"),
    (math(training={"group_size": "eight"}), 422, "training.group_size: Input should be a valid integer"),
    (math(training={"group_size": "8"}), 422, "training.group_size: Input should be a valid integer"),
    (math(training={"group_size": 10**9}), 422, "training.group_size: Input should be less than or equal to 256"),
    (math(training={"groups_per_step": -4}), 422, "training.groups_per_step: Input should be greater than 0"),
    (math(training={"max_steps": 1e30}), 422, "training.max_steps"),
    (math(training={"learning_rate": float("nan")}), 422, "training.learning_rate: Input should be a finite number"),
    (math(training={"kl_penalty_coef": float("inf")}), 422, "training.kl_penalty_coef"),
    (math(training={"warm_start_examples": 10**12}), 422, "training.warm_start_examples"),
    (math(validation={"max_examples": -1}), 422, "validation.max_examples: Input should be greater than 0"),
    (math(validation={"every_n_steps": 10**8}), 422, "validation.every_n_steps"),
    (math(validation={"patience": 5000}), 422, "validation.patience"),
    (math(alerts={"rearm_steps": 0}), 422, "alerts.rearm_steps: Input should be greater than or equal to 1"),
    (math(alerts={"rearm_steps": 10**6}), 422, "alerts.rearm_steps: Input should be less than or equal to 100"),
    (math(seed=-1), 422, "seed: Input should be greater than or equal to 0"),
    (math(seed=10**400), 422, "seed"),
    (math(seed=True), 422, "seed: Input should be a valid integer"),
    (math(model={"backend": "quantum"}), 422, "model.backend: Input should be 'transformers', 'embedded', 'local' or 'serverless'"),
    (math(model={"name": "../etc"}), 422, "model.name: String should match pattern"),
    (math(reward={"judge_model": "j" * 257}), 422, "reward.judge_model: String should have at most 256 characters"),
    (math(colour="red"), 422, "colour: Extra inputs are not permitted"),
    (math(training={"speed": 11}), 422, "training.speed: Extra inputs are not permitted"),
    (math(training=[1, 2]), 422, "training: Input should be a valid dictionary"),
    (json.dumps({"environment": "2048", "environment_args": {"target_tile": 100}}), 422,
     "environment_args: environment '2048': target_tile must be a power of two from 8 to 2048, got 100"),
    (math(environment_args={"colour": "red"}), 422, "environment_args: environment 'math' takes level; got unknown colour"),
    (math(environment_args={"x": [1]}), 422, "environment_args.x"),
    (math(environment_args={"x": "s" * 2000}), 422, "environment_args: 'x' is too long"),
    (math(model={"backend": "local"}), 422, "model.base_model is required for the local backend"),
]


UNREADABLE = [
    (b'{"environment": "\xff"}', "body: unreadable JSON: not UTF-8 text"),
    (b"[" * 5000 + b"]" * 5000, "body: unreadable JSON: nested too deeply"),
    (b'{"environment": "math", "seed": ' + b"9" * 5000 + b"}", "body: unreadable JSON: Exceeds the limit"),
]


@pytest.mark.parametrize(("body", "message"), UNREADABLE)
@sqlite_only
def test_an_unreadable_body_is_explained(client, auth, body, message):
    response = client.post("/v1/jobs", content=body, headers={**auth(), **JSON})
    assert response.status_code == 400 and response.json()["detail"].startswith(message)


@pytest.mark.parametrize(("body", "status", "message"), BAD_SUBMISSIONS)
@sqlite_only
def test_a_bad_submission_is_explained(client, auth, body, status, message):
    response = client.post("/v1/jobs", content=body.encode(), headers={**auth(), **JSON})
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]


@sqlite_only
def test_a_body_that_is_not_sent_as_json_is_explained(client, auth):
    response = client.post("/v1/jobs", content=math().encode(), headers={**auth(), "Content-Type": "text/plain"})
    assert response.status_code == 422
    assert response.json()["detail"] == "body: expected a JSON object sent with Content-Type: application/json"


@sqlite_only
def test_validation_errors_list_each_field(client, auth):
    body = {"environment": "math", "training": {"group_size": 0, "max_steps": 0}, "extra": 1}
    errors = client.post("/v1/jobs", json=body, headers=auth()).json()["errors"]
    assert {error["loc"] for error in errors} == {"training.group_size", "training.max_steps", "extra"}
    assert all(error["msg"] and error["type"] for error in errors)


@sqlite_only
def test_an_oversized_body_is_413(client, auth):
    padding = "x" * MAX_BODY_BYTES
    response = client.post("/v1/jobs", json={"environment": "math", "pad": padding}, headers=auth())
    assert response.status_code == 413 and f"limit of {MAX_BODY_BYTES} bytes" in response.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        for _ in range(4):
            yield b" " * (MAX_BODY_BYTES // 2)

    response = client.post("/v1/jobs", content=chunks(), headers={**auth(), **JSON})
    assert response.status_code == 413 and "larger than the limit" in response.json()["detail"]


@pytest.mark.parametrize("key", ["k" * 256, "k\x00", "tab\tbed", ""])
@sqlite_only
def test_an_idempotency_key_must_be_255_printable_ascii_characters(client, auth, key):
    response = client.post("/v1/jobs", json={"environment": "math"}, headers={**auth(), "Idempotency-Key": key})
    assert response.status_code == 422
    assert "header.idempotency-key: String should match pattern" in response.json()["detail"]


@pytest.mark.parametrize(
    "job_id", ["not-a-uuid", "1", "00000000-0000-4000-8000-000000000000", "%00", "x" * 5000, "'; DROP TABLE jobs; --"]
)
@pytest.mark.parametrize("suffix", ["", "/metrics", "/trajectories"])
def test_a_bad_job_id_is_404(client, auth, job_id, suffix):
    response = client.get(f"/v1/jobs/{job_id}{suffix}", headers=auth(Role.operator))
    assert response.status_code == 404 and response.json()["detail"].startswith("no job ")


@pytest.mark.parametrize(
    ("cursor", "status", "message"),
    [
        ("abc", 400, "malformed cursor 'abc'"),
        ("!!!!", 400, "malformed cursor"),
        ("é", 400, "malformed cursor"),
        (b64(b"not json"), 400, "malformed cursor"),
        (b64(b'{"a": 1}'), 400, "malformed cursor"),
        (b64(b'["2024-01-01T00:00:00+00:00", "not-a-uuid"]'), 400, "malformed cursor"),
        (b64(b'["yesterday", "00000000-0000-4000-8000-000000000000"]'), 400, "malformed cursor"),
        (b64(b'["2024-01-01T00:00:00", "00000000-0000-4000-8000-000000000000"]'), 400, "malformed cursor"),
        (b64(b'["0001-01-01T00:00:00+14:00", "00000000-0000-4000-8000-000000000000"]'), 400, "malformed cursor"),
        ("c" * 513, 422, "query.cursor: String should have at most 512 characters"),
    ],
)
@sqlite_only
def test_a_bad_cursor_is_refused(client, auth, cursor, status, message):
    response = client.get("/v1/jobs", params={"cursor": cursor}, headers=auth())
    assert response.status_code == status and message in response.json()["detail"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v1/jobs?status=bogus", "query.status: Input should be 'queued'"),
        ("/v1/jobs?limit=0", "query.limit: Input should be greater than or equal to 1"),
        ("/v1/jobs?limit=201", "query.limit: Input should be less than or equal to 200"),
        ("/v1/jobs?limit=ten", "query.limit: Input should be a valid integer"),
        ("/v1/jobs/{id}/trajectories?step=-1", "query.step: Input should be greater than or equal to 0"),
        ("/v1/jobs/{id}/trajectories?step=99999999999999999999", "query.step: Input should be less than or equal to"),
        ("/v1/jobs/{id}/trajectories?split=test", "query.split: Input should be 'train' or 'val'"),
        ("/v1/jobs/{id}/trajectories?limit=501", "query.limit: Input should be less than or equal to 500"),
    ],
)
@sqlite_only
def test_bad_query_parameters_are_422(client, auth, path, message):
    headers = auth()
    job_id = client.post("/v1/jobs", json={"environment": "math"}, headers=headers).json()["id"]
    response = client.get(path.format(id=job_id), headers=headers)
    assert response.status_code == 422 and message in response.json()["detail"]


@sqlite_only
def test_unknown_paths_and_methods_answer_json(client, auth):
    assert client.get("/v1/nothing-here", headers=auth()).json() == {"detail": "Not Found"}
    response = client.delete("/v1/jobs", headers=auth())
    assert response.status_code == 405 and response.json() == {"detail": "Method Not Allowed"}


@sqlite_only
def test_an_unreachable_store_is_503(app, auth):
    headers = auth()
    gone = "postgresql+psycopg://postgres@127.0.0.1:1/gone"  # nothing listens
    app.state.engine = store_db.make_engine(gone)
    app.state.loop_reads = LoopReads(store_db.make_engine(gone))  # the loop's own connection reads the token
    with TestClient(app) as client:
        response = client.get("/v1/jobs", headers=headers)
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert response.json() == {"detail": "the store is unavailable; try again shortly"}


@sqlite_only
def test_an_unexpected_error_is_a_generic_500_without_a_traceback(settings, engine):
    app = create_app(settings, engine=engine)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internals")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error; the server log has the details"}
