"""One submission path (service/submission.py), on SQLite and PostgreSQL: each refusal with the status the API answers
and nothing stored, the idempotent replay (even with a full queue), the manifest stored with the job, evaluations
likewise, and what the worker keeps of the manifest."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlmodel import Session, select

import environments
from service import manifests, submission
from service.auth import LOCAL_PRINCIPAL, Principal, create_token
from service.settings import Settings
from service.spec import EvaluationSpec, JobSpec
from service.store import events, jobs, runs
from service.store.tables import Job, JobKind, JobStatus, Role

MATH = {"environment": "math"}
BASELINE = "openai/baseline"


@pytest.fixture
def settings(settings) -> Settings:
    """The tests' settings with a queue of two and one baseline model allowed."""
    return settings.model_copy(update={"tenant_max_queued_jobs": 2, "baseline_models": [BASELINE]})


@pytest.fixture
def client(engine) -> Principal:
    with Session(engine) as session:
        token, _ = create_token(session, role=Role.client, name="tenant")
        session.commit()
        return Principal(id=token.id, role=Role.client)


def submit(engine, settings, spec: dict, *, caller: Principal = LOCAL_PRINCIPAL, key: str | None = None):
    with Session(engine, expire_on_commit=False) as session:
        return submission.submit(session, JobSpec.model_validate(spec), caller=caller, settings=settings,
                                 idempotency_key=key)  # fmt: skip


def evaluate(engine, settings, spec: dict, *, caller: Principal = LOCAL_PRINCIPAL) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        return submission.submit_evaluation(session, EvaluationSpec.model_validate(spec), caller=caller,
                                            settings=settings)  # fmt: skip


def stored(engine) -> list[Job]:
    with Session(engine) as session:
        return list(session.exec(select(Job).order_by(Job.created_at)).all())


def test_a_job_is_queued_with_its_manifest(engine, settings, client):
    job, replayed = submit(engine, settings, MATH, caller=client)
    assert not replayed and job.status is JobStatus.queued and job.owner_id == client.id
    [row] = stored(engine)
    env = environments.load("math", {})
    expected = manifests.training_manifest(manifests.recommended_spec(JobSpec.model_validate(MATH), env), env)
    assert row.id == job.id and row.manifest == expected
    assert row.manifest["code_version"] == manifests.code_version() and "runtime" not in row.manifest


def test_the_stored_job_and_its_queued_event_are_what_the_submission_returned(engine, settings, client):
    """The submission writes with Core inserts (runs.insert_queued): every column must reach the row as the job
    returned to the client has it, on both databases, and the job's log must start with its ``queued`` event."""
    job, _ = submit(engine, settings, MATH, caller=client, key="k-1")
    [row] = stored(engine)
    assert row.model_dump() == job.model_dump()
    with Session(engine) as session:
        [event] = events.events_after(session, job_id=job.id)
    assert (event.kind, event.step, event.data) == ("queued", None, {"environment": "math", "kind": "training"})
    assert abs((event.created_at - row.created_at).total_seconds()) < 60


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_operator_s_twin_that_loses_the_race_for_its_key_gets_the_first_job(engine, settings):
    """Operators' submissions are not held (tenancy.hold_queue), so on PostgreSQL two with one key can both find no
    earlier job and insert; the loser's insert waits on the key's unique index and fails once the winner commits. It
    must answer with the winner's job, not a 500. The winner here is a transaction held open by the test."""
    spec = manifests.recommended_spec(JobSpec.model_validate(MATH), environments.load("math", {}))  # as submitted
    winner = runs.new_job(spec=spec, owner_id=LOCAL_PRINCIPAL.id, idempotency_key="twin", request_hash=jobs.request_hash(spec))
    with Session(engine) as held, ThreadPoolExecutor(1) as pool:
        runs.insert_queued(held, winner)  # uncommitted: the twin's check for an earlier job cannot see it
        twin = pool.submit(submit, engine, settings, MATH, key="twin")
        time.sleep(1)  # the twin reaches its insert and waits on the unique index
        held.commit()
        job, replayed = twin.result(timeout=30)
    assert (job.id, replayed) == (winner.id, True)
    assert [row.id for row in stored(engine)] == [winner.id]


def test_a_retry_with_the_same_key_is_the_same_job_and_another_spec_is_a_conflict(engine, settings, client):
    first, replayed = submit(engine, settings, MATH, caller=client, key="k-1")
    again, replayed_again = submit(engine, settings, MATH, caller=client, key="k-1")
    assert (replayed, replayed_again) == (False, True) and again.id == first.id
    with pytest.raises(submission.KeyConflict, match="'k-1' was already used with a different job spec") as refused:
        submit(engine, settings, {**MATH, "seed": 7}, caller=client, key="k-1")
    assert refused.value.status == 409
    assert [job.id for job in stored(engine)] == [first.id]


def test_a_full_queue_is_a_429_to_retry_later_but_a_replay_is_still_answered(engine, settings, client):
    first, _ = submit(engine, settings, MATH, caller=client, key="first")
    submit(engine, settings, MATH, caller=client)
    with pytest.raises(submission.QueueFull, match="ARTSVC_TENANT_MAX_QUEUED_JOBS=2") as refused:
        submit(engine, settings, MATH, caller=client)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "60"}
    again, replayed = submit(engine, settings, MATH, caller=client, key="first")
    assert replayed and again.id == first.id
    submit(engine, settings, MATH)  # operators have no queue limit
    assert len(stored(engine)) == 3


EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}
PYTHON = {"type": "python", "name": "fn", "function": "this.x:y"}


@pytest.mark.parametrize(
    ("spec", "detail"),
    [
        ({"environment": "chess"}, "environment: unknown environment 'chess'; installed: "),
        ({**MATH, "environment_args": {"level": "calculus"}}, "environment_args: "),
        ({**MATH, "reward": {"mode": "ruler", "judge_model": "openai/o3"}},
         "reward.judge_model: 'openai/o3' is not a judge this server allows"),
        ({**MATH, "reward": {"mode": "grader", "grader": PYTHON}}, "reward.grader: "),
        ({**MATH, "validation": {"baseline_model": "openai/other"}},
         "validation.baseline_model: 'openai/other' is not a baseline model this server allows; allowed: openai/baseline"),
        ({**MATH, "training": {"max_steps": 10_001}}, "over this server's limit of 10000 steps per job"),
        ({**MATH, "training": {"max_steps": 10_000, "groups_per_step": 1024, "group_size": 256}},
         "over this server's limit of 2000000 per job (ARTSVC_MAX_ROLLOUTS_PER_JOB)"),
        ({**MATH, "training": {"max_steps": 1, "groups_per_step": 1024, "group_size": 256}},
         "training: groups_per_step x group_size is 262144 rollouts per step, over this server's limit of 1024"),
        ({**MATH, "training": {"warm_start_examples": 10_000_000}},
         "training.warm_start_examples: 10000000 is over this server's limit of 100000 demonstrations per warm start"),
    ],
)  # fmt: skip
def test_what_this_server_will_not_run_is_a_422_naming_the_field_and_nothing_is_stored(engine, settings, spec, detail):
    with pytest.raises(submission.Refused) as refused:
        submit(engine, settings, spec)
    assert type(refused.value) is submission.Refused and refused.value.status == 422
    assert detail in str(refused.value)
    assert stored(engine) == []


@pytest.mark.parametrize(
    ("model", "detail"),
    [
        ({"backend": "serverless", "base_model": "Qwen/Qwen2.5-7B-Instruct"}, "model.backend: 'serverless'"),
        ({"base_model": "embedded/char-gpt-0.8m-1k"}, "model.base_model: 'embedded/char-gpt-0.8m-1k' is not a base model"),
    ],
)
def test_a_client_token_uses_only_the_backends_and_base_models_the_operator_allows(engine, settings, client, model, detail):
    with pytest.raises(submission.Refused, match=detail):
        submit(engine, settings, {**MATH, "model": model}, caller=client)
    submit(engine, settings, {**MATH, "model": model})  # an operator's choice
    assert [job.owner_id for job in stored(engine)] == [LOCAL_PRINCIPAL.id]


def test_a_grader_is_checked_against_the_operator_s_settings(engine, settings):
    submit(engine, settings, {**MATH, "reward": {"mode": "grader", "grader": EXACT}})
    with pytest.raises(submission.Refused, match="'this.x:y' is not a registered grader function"):
        submit(engine, settings, {**MATH, "reward": {"mode": "grader", "grader": PYTHON}})
    assert len(stored(engine)) == 1


def test_an_evaluation_is_queued_with_its_manifest_and_refused_like_a_job(engine, settings, client):
    evaluation = evaluate(engine, settings, {"model": {"litellm": BASELINE}, **MATH}, caller=client)
    [row] = stored(engine)
    assert row.id == evaluation.id and row.kind == JobKind.evaluation and row.status == JobStatus.queued
    assert row.manifest["model"] == {"kind": "litellm", "model": BASELINE} and row.manifest["kind"] == "evaluation"
    with pytest.raises(submission.Refused, match="model.litellm: 'openai/other' is not a baseline model") as refused:
        evaluate(engine, settings, {"model": {"litellm": "openai/other"}, **MATH}, caller=client)
    assert refused.value.status == 422
    evaluate(engine, settings, {"model": {"litellm": BASELINE}, **MATH}, caller=client)
    with pytest.raises(submission.QueueFull):
        evaluate(engine, settings, {"model": {"litellm": BASELINE}, **MATH}, caller=client)
    assert len(stored(engine)) == 2


def test_a_checkpoint_of_a_job_that_has_not_ended_is_a_409(engine, settings):
    job, _ = submit(engine, settings, MATH)
    with pytest.raises(submission.NotEnded, match=f"job {job.id} is queued; evaluate its checkpoints once") as refused:
        evaluate(engine, settings, {"model": {"job_id": job.id}})
    assert refused.value.status == 409
    assert [row.id for row in stored(engine)] == [job.id]


def test_the_worker_keeps_the_submitted_manifest_unless_its_code_differs(engine, settings):
    job, _ = submit(engine, settings, MATH)
    remade = {"remade": True}
    assert manifests.refreshed(job.manifest, lambda: remade) == job.manifest
    assert manifests.refreshed({**job.manifest, "code_version": "0.0.1"}, lambda: remade) == remade
    assert manifests.refreshed(None, lambda: remade) == remade  # a job stored without one
