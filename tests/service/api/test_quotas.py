"""What one tenant may ask of the server (service/tenancy.py): queued jobs (429, exact under parallel submissions on
SQLite and PostgreSQL), steps and rollouts per job, the rollouts of a step, the demonstrations of a warm start and
the examples of a validation, and the backends and base models client tokens may name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from service.app import create_app
from service.store.tables import Job, JobStatus, Role
from tests.databases import sqlite_only

MATH = {"environment": "math"}
BASELINE = "openai/baseline"
QUEUE_LIMIT = 4


@pytest.fixture
def settings(settings):
    """The tests' settings with a short queue (``live_server`` serves these); ``serve`` changes more."""
    return settings.model_copy(update={"tenant_max_queued_jobs": QUEUE_LIMIT})


@pytest.fixture
def serve(settings, engine) -> Iterator[Callable[..., TestClient]]:
    """``serve(**settings)``: an in-process client of the API under those settings."""
    clients: list[TestClient] = []

    def start(**overrides) -> TestClient:
        client = TestClient(create_app(settings.model_copy(update=overrides), engine=engine))
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def _queued(engine) -> int:
    with Session(engine) as session:
        query = select(func.count()).select_from(Job).where(Job.status == JobStatus.queued)
        return session.exec(query).one()


def test_a_client_with_a_full_queue_gets_429_naming_the_limit_while_others_still_submit(serve, auth):
    client = serve(tenant_max_queued_jobs=3, baseline_models=[BASELINE])
    flooder = auth()
    first = [client.post("/v1/jobs", json={**MATH, "seed": n}, headers=flooder) for n in range(2)]
    evaluation = client.post("/v1/evaluations", json={"model": {"litellm": BASELINE}, **MATH}, headers=flooder)
    assert [r.status_code for r in [*first, evaluation]] == [201, 201, 201]  # evaluations wait in the same queue

    refused = client.post("/v1/jobs", json=MATH, headers=flooder)
    assert refused.status_code == 429 and refused.headers["Retry-After"].isdigit()
    detail = refused.json()["detail"]
    assert "tenant_max_queued_jobs" in detail and "3 jobs and evaluations queued" in detail
    assert "ARTSVC_TENANT_MAX_QUEUED_JOBS=3" in detail
    again = client.post("/v1/evaluations", json={"model": {"litellm": BASELINE}, **MATH}, headers=flooder)
    assert again.status_code == 429

    assert client.post("/v1/jobs", json=MATH, headers=auth()).status_code == 201  # another tenant is not held up
    operator = auth(Role.operator)
    assert all(client.post("/v1/jobs", json=MATH, headers=operator).status_code == 201 for _ in range(4))

    cancelled = client.post(f"/v1/jobs/{first[0].json()['id']}/cancel", headers=flooder)
    assert cancelled.json()["status"] == "cancelled"
    assert client.post("/v1/jobs", json=MATH, headers=flooder).status_code == 201  # a slot came free


def test_an_idempotent_replay_is_answered_even_when_the_queue_is_full(serve, auth):
    client = serve(tenant_max_queued_jobs=1)
    headers = {**auth(), "Idempotency-Key": "once"}
    made = client.post("/v1/jobs", json=MATH, headers=headers)
    replay = client.post("/v1/jobs", json=MATH, headers=headers)
    assert replay.status_code == 201 and replay.json()["id"] == made.json()["id"]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert client.post("/v1/jobs", json=MATH, headers={**headers, "Idempotency-Key": "twice"}).status_code == 429


@pytest.mark.parametrize("keyed", [False, True], ids=["new-jobs", "one-key"])
def test_parallel_submissions_of_one_client_never_overfill_its_queue(live_server, engine, auth, keyed):
    """Hostile clients send in parallel: counting the queue and adding to it happen as one step."""
    sent = 24
    headers = {**auth(), **({"Idempotency-Key": "burst"} if keyed else {})}

    def post(_):
        return httpx.post(f"{live_server}/v1/jobs", json=MATH, headers=headers, timeout=60)

    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(post, range(sent)))
    codes = [r.status_code for r in responses]
    if keyed:  # one job, every other request its replay
        assert codes == [201] * sent and len({r.json()["id"] for r in responses}) == 1
        assert _queued(engine) == 1
    else:
        assert sorted(codes) == [201] * QUEUE_LIMIT + [429] * (sent - QUEUE_LIMIT), codes
        assert _queued(engine) == QUEUE_LIMIT


@sqlite_only
@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"max_steps": 51},
         "training.max_steps: 51 is over this server's limit of 50 steps per job (ARTSVC_MAX_STEPS_PER_JOB)"),
        ({"max_steps": 50, "groups_per_step": 8, "group_size": 8},
         "training: max_steps x groups_per_step x group_size is 3200 rollouts, over this server's limit of 1000 "
         "per job (ARTSVC_MAX_ROLLOUTS_PER_JOB)"),
    ],
    ids=["steps", "rollouts"],
)  # fmt: skip
def test_jobs_larger_than_the_per_job_limits_are_refused_for_every_token(serve, auth, training, message):
    client = serve(max_steps_per_job=50, max_rollouts_per_job=1000)
    for role in (Role.client, Role.operator):
        response = client.post("/v1/jobs", json={**MATH, "training": training}, headers=auth(role))
        assert (response.status_code, response.json()["detail"]) == (422, message)
    small = {**MATH, "training": {"max_steps": 50, "groups_per_step": 4, "group_size": 5}}  # 1000 rollouts
    assert client.post("/v1/jobs", json=small, headers=auth()).status_code == 201


@sqlite_only
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**MATH, "training": {"max_steps": 1, "groups_per_step": 2, "group_size": 2, "warm_start_examples": 10_000_000}},
         "training.warm_start_examples: 10000000 is over this server's limit of 100000 demonstrations per warm start "
         "(ARTSVC_MAX_WARM_START_EXAMPLES)"),
        ({**MATH, "training": {"max_steps": 1, "groups_per_step": 1024, "group_size": 256}},
         "training: groups_per_step x group_size is 262144 rollouts per step, over this server's limit of 1024 "
         "(ARTSVC_MAX_ROLLOUTS_PER_STEP)"),
        ({**MATH, "validation": {"max_examples": 1001}},
         "validation.max_examples: 1001 is over this server's limit of 1000 examples per validation "
         "(ARTSVC_MAX_VALIDATION_EXAMPLES)"),
    ],
    ids=["warm_start", "step", "validation"],
)  # fmt: skip
def test_a_warm_start_a_step_or_a_validation_larger_than_the_per_phase_limits_is_refused_for_every_token(
    serve, auth, spec, message
):
    client = serve()  # the defaults
    for role in (Role.client, Role.operator):
        response = client.post("/v1/jobs", json=spec, headers=auth(role))
        assert (response.status_code, response.json()["detail"]) == (422, message)
    largest = {**MATH, "training": {"groups_per_step": 32, "group_size": 32}, "validation": {"max_examples": 1000}}
    assert client.post("/v1/jobs", json=largest, headers=auth()).status_code == 201


@sqlite_only
def test_the_environment_s_recommended_warm_start_is_held_to_the_limit_too(serve, auth):
    embedded = {**MATH, "model": {"backend": "embedded"}}  # math recommends 51,200 demonstrations from scratch
    assert serve().post("/v1/jobs", json=embedded, headers=auth()).status_code == 201
    refused = serve(max_warm_start_examples=50_000).post("/v1/jobs", json=embedded, headers=auth(Role.operator))
    assert (refused.status_code, refused.json()["detail"]) == (422, (
        "training.warm_start_examples: unset, the environment's 51200, is over this server's limit of 50000 "
        "demonstrations per warm start (ARTSVC_MAX_WARM_START_EXAMPLES)"))  # fmt: skip


@sqlite_only
def test_client_tokens_use_only_the_backends_the_operator_allows(serve, auth):
    serverless = {**MATH, "model": {"backend": "serverless", "base_model": "Qwen/Qwen2.5-0.5B-Instruct"}}
    client = serve(client_backends=["embedded"], client_base_models=["*"])
    refused = client.post("/v1/jobs", json=serverless, headers=auth())
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        "model.backend: 'serverless' is not a backend this server lets client tokens use; allowed: embedded "
        "(the operator sets ARTSVC_CLIENT_BACKENDS)"
    )
    assert client.post("/v1/jobs", json=serverless, headers=auth(Role.operator)).status_code == 201
    opened = serve(client_backends=["embedded", "serverless"], client_base_models=["*"])
    assert opened.post("/v1/jobs", json=serverless, headers=auth()).status_code == 201


@sqlite_only
def test_client_tokens_use_the_recommended_base_model_unless_the_operator_lists_more(serve, auth):
    tiny, email_default = "embedded/char-gpt-0.2m", "embedded/char-gpt-0.8m-1k"
    client = serve(client_base_models=[])
    assert client.post("/v1/jobs", json=MATH, headers=auth()).status_code == 201  # unset: the recommended one
    named = {"environment": "email", "model": {"base_model": email_default}}
    assert client.post("/v1/jobs", json=named, headers=auth()).status_code == 201  # the environment's own choice
    refused = client.post("/v1/jobs", json={**MATH, "model": {"base_model": tiny}}, headers=auth())
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        "model.base_model: 'embedded/char-gpt-0.2m' is not a base model this server lets client tokens use; "
        "allowed: embedded/char-gpt-0.8m (the operator sets ARTSVC_CLIENT_BASE_MODELS)"
    )
    tiny_job = {**MATH, "model": {"base_model": tiny}}
    assert client.post("/v1/jobs", json=tiny_job, headers=auth(Role.operator)).status_code == 201
    assert serve(client_base_models=[tiny]).post("/v1/jobs", json=tiny_job, headers=auth()).status_code == 201
    anything = serve(client_base_models=["*"])
    local = {**MATH, "model": {"backend": "local", "base_model": "Qwen/Qwen2.5-0.5B-Instruct"}}
    assert anything.post("/v1/jobs", json=local, headers=auth()).status_code == 422  # the backend is still refused
    opened = serve(client_base_models=["*"], client_backends=["local"])
    assert opened.post("/v1/jobs", json=local, headers=auth()).status_code == 201
