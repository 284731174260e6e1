"""Evaluations and the promotion gate against a real baseline model server on loopback (tests/service/policy_server.py)
and the real store: manifests, the Locked Room rejections, the bootstrap gate overall and per outcome, best-of-N."""

from __future__ import annotations

import json
import shutil

import pytest
from sqlmodel import Session

from environments.math.env import MathEnvironment
from service.evaluation.compare import Measured, compare
from service.evaluation.runner import run_evaluation
from service.settings import Settings
from service.spec import EvaluationSpec
from service.store import runs
from service.store.events import events_after
from service.store.tables import Job, JobStatus
from tests.databases import sqlite_only
from tests.service.policy_server import policy_server

MODELS = ["openai/oracle", "openai/sloppy", "openai/terse", "openai/dice", "openai/clueless"]


@pytest.fixture
def baseline_api():
    with policy_server() as api_base:
        yield api_base


@pytest.fixture
def settings(database_url, tmp_path, baseline_api) -> Settings:
    return Settings(_env_file=None, database_url=database_url, data_dir=tmp_path / "data",
                    baseline_models=MODELS, baseline_api_base=baseline_api)  # fmt: skip


async def evaluate(engine, settings: Settings, model: str, **spec) -> Job:
    evaluation = EvaluationSpec.model_validate({"model": {"litellm": model}, "environment": "math", "max_examples": 100, **spec})
    with Session(engine) as session:
        job = runs.create_evaluation(session, spec=evaluation, environment="math")
        session.commit()
        job_id = job.id
    return await run_evaluation(job_id, db=engine, data_dir=settings.data_dir, settings=settings)


def measured(engine, job: Job) -> Measured:
    with Session(engine) as session:
        return Measured(job.id, job.kind, 0, job.manifest, runs.example_results(session, job_id=job.id, step=0))


@pytest.mark.asyncio
@sqlite_only
async def test_an_evaluation_stores_its_summary_failure_table_and_per_example_results(engine, settings):
    job = await evaluate(engine, settings, "openai/sloppy")
    assert job.status == JobStatus.succeeded
    summary = job.summary
    assert summary["examples"] == 100 and 0.45 < summary["pass_rate"] < 0.75  # right on about 3 questions in 5
    assert summary["mean_reward"] == summary["pass_rate"]  # the math reward is 1 for correct, else 0
    assert summary["failures"][0]["outcome"] == "wrong_answer"
    assert summary["failures"][0]["count"] == round(100 * (1 - summary["pass_rate"]))
    assert summary["selection"] is None and summary["pass_at_k"] == {"1": summary["pass_rate"]}
    with Session(engine) as session:
        rows = runs.example_results(session, job_id=job.id, step=0)
    assert [r.position for r in rows] == list(range(100))
    wrong = next(r for r in rows if not r.correct)
    assert wrong.outcome == "wrong_answer" and wrong.completion.startswith("Final: ")
    assert job.manifest["locked"]["split"] == "val" and job.manifest["model"] == {"kind": "litellm", "model": "openai/sloppy"}


@pytest.mark.asyncio
@sqlite_only
async def test_a_run_with_one_val_answer_changed_is_rejected_with_the_fingerprint_named(engine, settings, tmp_path, monkeypatch):
    original = await evaluate(engine, settings, "openai/sloppy")
    tampered = tmp_path / "math-tampered"
    shutil.copytree(MathEnvironment.scenario_dir, tampered)
    rows = [json.loads(line) for line in (tampered / "val.jsonl").read_text().splitlines()]
    rows[3]["expected_answer"] += 1  # one expected answer changed
    (tampered / "val.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    monkeypatch.setattr(MathEnvironment, "scenario_dir", tampered)
    rerun = await evaluate(engine, settings, "openai/sloppy")

    verdict = compare(measured(engine, original), measured(engine, rerun))
    assert verdict["decision"] == "REJECT" and not verdict["comparable"]
    assert [d["field"] for d in verdict["differences"]] == ["locked.split_fingerprint"]
    assert any("split_fingerprint" in reason for reason in verdict["reasons"])


@pytest.mark.asyncio
@sqlite_only
async def test_a_run_scored_by_a_new_scorer_version_is_rejected(engine, settings, monkeypatch):
    original = await evaluate(engine, settings, "openai/sloppy")
    monkeypatch.setattr(MathEnvironment, "scorer_version", "math-strict-1.0.1")
    rescored = await evaluate(engine, settings, "openai/sloppy")
    verdict = compare(measured(engine, original), measured(engine, rescored))
    assert verdict["decision"] == "REJECT"
    assert [d["field"] for d in verdict["differences"]] == ["locked.scorer_version"]


@pytest.mark.asyncio
@sqlite_only
async def test_comparable_runs_are_gated_by_the_bootstrap_interval_and_min_delta(engine, settings):
    sloppy, oracle = await evaluate(engine, settings, "openai/sloppy"), await evaluate(engine, settings, "openai/oracle")
    better = compare(measured(engine, sloppy), measured(engine, oracle), min_delta=0.05)
    assert better["comparable"] and better["decision"] == "ACCEPT", better["reasons"]
    overall = better["overall"]
    assert overall["candidate"] == 1.0 and overall["delta"] == pytest.approx(1.0 - overall["baseline"])
    assert overall["ci_low"] <= overall["delta"] <= overall["ci_high"]
    assert overall["ci_low"] > 0.05
    examples = better["baseline"]["examples"]  # the delta is the examples that moved, and only they
    assert overall["baseline_only"] == 0 and overall["candidate_only"] == round(overall["delta"] * examples) > 0
    too_much = compare(measured(engine, sloppy), measured(engine, oracle), min_delta=0.6)
    assert too_much["decision"] == "REJECT" and "min_delta" in too_much["reasons"][0]
    same = compare(measured(engine, sloppy), measured(engine, sloppy), min_delta=0.0)
    assert same["decision"] == "ACCEPT" and same["overall"]["ci_low"] == same["overall"]["ci_high"] == 0.0
    assert same["overall"]["candidate_only"] == same["overall"]["baseline_only"] == 0
    worse = compare(measured(engine, oracle), measured(engine, sloppy), min_delta=0.0)
    assert worse["decision"] == "REJECT"
    assert (worse["overall"]["candidate_only"], worse["overall"]["baseline_only"]) == (0, overall["candidate_only"])


@pytest.mark.asyncio
@sqlite_only
async def test_a_regression_in_one_outcome_shows_even_when_the_total_rises(engine, settings):
    sloppy, terse = await evaluate(engine, settings, "openai/sloppy"), await evaluate(engine, settings, "openai/terse")
    verdict = compare(measured(engine, sloppy), measured(engine, terse), min_delta=0.0)
    assert verdict["overall"]["delta"] > 0.1  # terse is right more often...
    by_outcome = {row["outcome"]: row for row in verdict["outcomes"]}
    assert by_outcome["missing_prefix"]["regressed"] and by_outcome["missing_prefix"]["baseline"] == 0.0
    examples = verdict["baseline"]["examples"]  # every example that moved into the new failure is counted there
    new_failure = by_outcome["missing_prefix"]
    assert new_failure["candidate_only"] == round(new_failure["candidate"] * examples) > 0
    assert new_failure["baseline_only"] == 0
    assert not by_outcome["wrong_answer"]["regressed"] and by_outcome["correct"]["failure"] is False
    assert verdict["decision"] == "REJECT"  # ...but a new failure mode appeared
    assert any(reason.startswith("outcome missing_prefix rose") for reason in verdict["reasons"])


@pytest.mark.asyncio
@sqlite_only
async def test_best_of_n_is_selection_reported_with_pass_at_k_and_is_deterministic(engine, settings):
    runs_ = [await evaluate(engine, settings, "openai/dice", n=4, ks=[1, 2, 4], max_examples=30) for _ in range(5)]
    digests = {job.summary["selection_digest"] for job in runs_}
    assert len(digests) == 1  # the same output hash over 5 runs
    summary = runs_[0].summary
    assert summary["selection"].startswith("selection (best-of-N by reward), not learning")
    with Session(engine) as session:
        rows = runs.example_results(session, job_id=runs_[0].id, step=0)
    counts = [(r.samples, r.correct_samples) for r in rows]
    from service.evaluation.selection import mean_pass_at_k

    for k in (1, 2, 4):
        assert summary["pass_at_k"][str(k)] == pytest.approx(mean_pass_at_k(counts, k))
    assert summary["pass_rate"] == sum(c > 0 for _, c in counts) / len(counts)  # best-of-4 picks a correct one if any
    assert summary["pass_rate"] > summary["pass_at_k"]["1"]  # selection lifts the number; the policy did not change
    assert all(len(r.details["candidates"]) == 4 for r in rows)


@pytest.mark.asyncio
@sqlite_only
async def test_an_unknown_provider_or_a_disallowed_model_fails_the_evaluation_with_a_clear_error(engine, settings):
    settings.baseline_models.append("nosuchprovider/model")
    with pytest.raises(ValueError, match="litellm cannot route"):
        await evaluate(engine, settings, "nosuchprovider/model")
    settings.baseline_models.remove("openai/dice")
    with pytest.raises(ValueError, match="not a baseline model this server allows"):
        await evaluate(engine, settings, "openai/dice")


@pytest.mark.asyncio
@sqlite_only
async def test_a_job_that_names_a_baseline_measures_it_first_and_stops_once_it_beats_it(engine, settings, tiny_lm):
    from service.backends.transformers.engine import default_device
    from service.backends.transformers.precision import dtype_name, resolve
    from service.spec import JobSpec
    from service.training.loop import run_job

    spec = JobSpec.model_validate({
        "environment": "math", "model": {"backend": "transformers", "base_model": str(tiny_lm)},  # any policy will do
        "training": {"warm_start_examples": 0, "max_steps": 3, "groups_per_step": 2, "group_size": 2},
        "validation": {"max_examples": 10, "baseline_model": "openai/clueless", "beat_baseline_by": 0.0},
    })  # fmt: skip
    with Session(engine) as session:
        job = runs.create_job(session, spec=spec)
        session.commit()
        job_id = job.id
    ended = await run_job(job_id, db=engine, data_dir=settings.data_dir, settings=settings)
    assert ended.stop_reason.value == "beat_baseline" and ended.step == 0  # 0.0 >= 0.0 + 0.0 at the first validation
    with Session(engine) as session:
        baseline = runs.baseline_evaluation(session, job_id=job_id)
        assert baseline.status == JobStatus.succeeded and baseline.summary["pass_rate"] == 0.0
        assert baseline.summary["failures"][0]["outcome"] == "missing_prefix"
        trained = runs.get_job(session, job_id=job_id)
        job_side = Measured(trained.id, trained.kind, 0, trained.manifest, runs.example_results(session, job_id=job_id, step=0))
    verdict = compare(measured(engine, baseline), job_side)
    assert verdict["comparable"], verdict["reasons"]  # the baseline was measured on the job's own validation examples
    here = dtype_name(resolve(settings.precision, default_device()))
    assert trained.manifest["locked"]["precision"] == here  # locked; the litellm baseline has none to share
    assert verdict["baseline"]["examples"] == verdict["candidate"]["examples"] == 10


@pytest.mark.asyncio
@sqlite_only
async def test_a_cancelled_evaluation_stops_within_a_tenth_of_its_rollouts_and_records_no_results(engine, settings):
    from service.store import jobs

    evaluation = EvaluationSpec.model_validate({"model": {"litellm": "openai/sloppy"}, "environment": "math", "max_examples": 100})
    with Session(engine) as session:
        job = runs.create_evaluation(session, spec=evaluation, environment="math")
        session.commit()
        job_id = job.id
    with Session(engine) as session:  # asked for before the worker's first progress mark reads it
        job = runs.get_job(session, job_id=job_id)
        job.status = JobStatus.running
        session.add(job)
        session.commit()
        jobs.request_cancel(session, job=job, requested_by="test")
        session.commit()
    ended = await run_evaluation(job_id, db=engine, data_dir=settings.data_dir, settings=settings)
    assert ended.status == JobStatus.cancelled and ended.stop_reason.value == "cancelled" and ended.summary is None
    with Session(engine) as session:
        assert runs.example_results(session, job_id=job_id, step=0) == []
        progress = [e.data for e in events_after(session, job_id=job_id) if e.kind == "progress"]
    assert progress and max(p["done"] for p in progress) < progress[0]["total"] == 100  # stopped early


@pytest.mark.asyncio
@sqlite_only
async def test_two_training_runs_one_with_a_changed_val_answer_are_rejected_with_the_fingerprint_named(
    engine, settings, tmp_path, monkeypatch
):
    from service.spec import JobSpec
    from service.training.loop import run_job

    spec = JobSpec.model_validate({
        "environment": "math", "model": {"base_model": "embedded/char-gpt-0.2m"},
        "training": {"warm_start_examples": 0, "max_steps": 1, "groups_per_step": 2, "group_size": 2},
        "validation": {"max_examples": 10, "every_n_steps": 1},
    })  # fmt: skip

    async def train() -> Measured:
        with Session(engine) as session:
            job = runs.create_job(session, spec=spec)
            session.commit()
            job_id = job.id
        ended = await run_job(job_id, db=engine, data_dir=tmp_path / job_id, settings=settings)
        with Session(engine) as session:
            return Measured(job_id, ended.kind, ended.best_step, ended.manifest,
                            runs.example_results(session, job_id=job_id, step=ended.best_step))  # fmt: skip

    original = await train()
    again = compare(original, await train())
    assert again["comparable"] and again["overall"]["delta"] == 0.0  # the same run again: comparable, and equal
    tampered = tmp_path / "math-tampered"
    shutil.copytree(MathEnvironment.scenario_dir, tampered)
    rows = [json.loads(line) for line in (tampered / "val.jsonl").read_text().splitlines()]
    rows[0]["expected_answer"] += 1
    (tampered / "val.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    monkeypatch.setattr(MathEnvironment, "scenario_dir", tampered)
    verdict = compare(original, await train())
    assert verdict["decision"] == "REJECT"
    assert [d["field"] for d in verdict["differences"]] == ["locked.split_fingerprint"]


def test_a_ruler_job_cannot_name_a_baseline_it_could_not_be_compared_with():
    from service.spec import JobSpec

    with pytest.raises(ValueError, match="ruler mode has none"):
        JobSpec.model_validate({"environment": "math", "reward": {"mode": "ruler", "judge_model": "openai/judge"},
                                "validation": {"baseline_model": "openai/oracle"}})  # fmt: skip
