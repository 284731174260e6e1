"""The training loop end to end on the embedded backend and a real SQLite store."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from environments.math import MathEnvironment
from environments.math.scorer import OUTCOMES
from service.runner.control import JobHooks, JobInterrupted
from service.spec import JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.events import events_after
from service.store.tables import BASE_STEP, JobStatus, SampledTrajectory, StopReason, TrainingStep
from service.training.loop import run_job
from service.training.warm_start import PRETRAINED_TURNS_PER_BATCH, WARM_START_TURNS_PER_BATCH, warm_start_batch_size

TINY_RUN = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {"warm_start_examples": 0, "max_steps": 4, "groups_per_step": 2, "group_size": 4, "learning_rate": 1e-3},
    "validation": {"every_n_steps": 2, "max_examples": 8},
    "seed": 5,
}


class Crash(BaseException):
    """Stands in for the process dying: not an Exception, so nothing records it."""


def _new_store(root):
    url = f"sqlite:///{root / 'store.db'}"
    store_db.upgrade(url)
    return store_db.make_engine(url)


def _submit(engine, spec: dict) -> str:
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec.model_validate(spec))
        session.commit()
        return job.id


def _history(engine, job_id):
    with Session(engine) as session:
        steps = [(s.step, s.reward_mean, s.loss, s.kl) for s in runs.steps(session, job_id=job_id)]
        points = [(p.step, p.accuracy, p.greedy_accuracy, p.outcomes) for p in runs.validation_points(session, job_id=job_id)]
        return steps, points


@pytest.mark.asyncio
async def test_a_run_records_every_step_and_validation_point_and_stops(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, TINY_RUN)
    events = []
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=lambda k, d: events.append((k, d))))
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.max_steps and job.step == 4
    steps, points = _history(engine, job_id)
    assert [s[0] for s in steps] == [1, 2, 3, 4]
    assert [p[0] for p in points] == [0, 2, 4]
    assert job.step0_val_accuracy == points[0][1]
    assert job.best_val_accuracy == max(p[1] for p in points)
    assert sum(points[0][3].values()) == 8  # every validation example has an outcome
    assert [d["step"] for k, d in events if k == "step"] == [1, 2, 3, 4]
    with Session(engine) as session:
        row = session.get(TrainingStep, 1)
        assert row.completion_length > 0 and row.wall_time_s > 0 and row.groups == 2
        assert {"rollout_s", "train_s", "trainable_groups"} <= set(row.metrics)


@pytest.mark.asyncio
async def test_resume_after_a_crash_continues_at_the_right_step_without_duplicates(tmp_path):
    reference_store = _new_store(tmp_path / "reference")
    reference_id = _submit(reference_store, TINY_RUN)
    await run_job(reference_id, db=reference_store, data_dir=tmp_path / "reference" / "data")
    expected = _history(reference_store, reference_id)

    engine = _new_store(tmp_path / "crashed")
    job_id = _submit(engine, TINY_RUN)

    def crash_after_step_3(kind, data):
        if kind == "step" and data["step"] == 3:
            raise Crash()

    with pytest.raises(Crash):
        await run_job(job_id, db=engine, data_dir=tmp_path / "crashed" / "data", hooks=JobHooks(on_event=crash_after_step_3))
    # the checkpoint of step 3 exists, but pretend the process died before its row was committed
    with Session(engine) as session:
        session.delete(next(s for s in runs.steps(session, job_id=job_id) if s.step == 3))
        session.commit()
        assert runs.get_job(session, job_id=job_id).status is JobStatus.running

    job = await run_job(job_id, db=engine, data_dir=tmp_path / "crashed" / "data")
    assert job.status is JobStatus.succeeded and job.step == 4
    # same seed, same config: the interrupted run ends exactly where the uninterrupted one did
    assert _history(engine, job_id) == expected


@pytest.mark.asyncio
async def test_a_failing_run_is_recorded_as_failed_with_the_error(tmp_path):
    engine = _new_store(tmp_path)
    spec = {**TINY_RUN, "model": {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "backend": "serverless"}}
    job_id = _submit(engine, spec)
    with pytest.raises(Exception, match="WANDB_API_KEY"):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data")
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        assert job.status is JobStatus.failed and job.stop_reason is StopReason.error
        assert "WANDB_API_KEY" in job.error


FORMAT_OUTCOMES = ("missing_prefix", "extra_whitespace", "not_single_line", "leading_zeros", "not_integer")


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.timeout(1500)  # about 3-5 minutes on an idle 2-core machine, several times that on a busy one
async def test_a_short_run_from_a_warm_start_learns(tmp_path):
    """Warm start, then GRPO against the strict scorer: validation accuracy rises and format slips fall."""
    spec = {
        "environment": "math",
        "model": {"base_model": "embedded/char-gpt-0.8m"},  # the policy that learns within a test's budget
        "training": {"warm_start_examples": 38_400, "max_steps": 10, "learning_rate": 1e-4},
        "validation": {"every_n_steps": 5, "max_examples": 100},
        "seed": 0,
    }
    engine = _new_store(tmp_path)
    job_id = _submit(engine, spec)
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data")
    _, points = _history(engine, job_id)
    step0, best = points[0], max(points, key=lambda p: p[1])
    assert job.status is JobStatus.succeeded and job.step == 10
    assert best[1] >= step0[1] + 0.05, points
    assert sum(best[3].get(k, 0) for k in FORMAT_OUTCOMES) < sum(step0[3].get(k, 0) for k in FORMAT_OUTCOMES)
    assert step0[2] > 0.5  # the warm start knows the arithmetic; sampling is what RL must fix


@pytest.mark.asyncio
async def test_events_and_sampled_rollouts_are_stored_with_their_steps(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, TINY_RUN)
    await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(trajectories_per_step=3))
    with Session(engine) as session:
        kinds = [(e.kind, e.step) for e in events_after(session, job_id=job_id)]
        rollouts = session.exec(select(SampledTrajectory).where(SampledTrajectory.job_id == job_id)).all()
    assert kinds[:2] == [("queued", None), ("started", None)]
    assert [k for k in kinds if k[0] in ("step", "validation")] == [
        ("validation", 0), ("step", 1), ("step", 2), ("validation", 2), ("step", 3), ("step", 4), ("validation", 4)
    ]  # fmt: skip
    assert kinds[-1] == ("finished", None)
    train = [r for r in rollouts if r.split == "train"]
    assert sorted({r.step for r in train}) == [1, 2, 3, 4] and len(train) == 4 * 3
    first = next(r for r in train if r.step == 1)
    assert first.messages[0]["role"] == "system" and first.messages[-1]["role"] == "assistant"  # the opening, a reply
    assert first.details["metadata"]["outcome"] in OUTCOMES and first.scenario_id
    assert {r.step for r in rollouts if r.split == "val"} == {0, 2, 4}


@pytest.mark.asyncio
async def test_a_cancel_request_stops_the_job_at_the_next_step_boundary(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, TINY_RUN)

    def cancel_after_step_2(kind, data):
        if kind == "step" and data["step"] == 2:
            with Session(engine) as session:
                job = runs.get_job(session, job_id=job_id)
                job.cancel_requested = True
                session.add(job)
                session.commit()

    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=cancel_after_step_2))
    assert job.status is JobStatus.cancelled and job.stop_reason is StopReason.cancelled
    assert job.step == 2 and job.best_step is not None  # validation at step 2 ran before the boundary


@pytest.mark.asyncio
async def test_should_stop_interrupts_without_recording_and_the_job_resumes(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, TINY_RUN)
    seen: list[int] = []
    hooks = JobHooks(on_event=lambda k, d: seen.append(d["step"]) if k == "step" else None, should_stop=lambda: len(seen) >= 1)
    with pytest.raises(JobInterrupted):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=hooks)
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        assert job.status is JobStatus.running and job.finished_at is None and job.step == 1
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data")
    assert job.status is JobStatus.succeeded and [s[0] for s in _history(engine, job_id)[0]] == [1, 2, 3, 4]


@pytest.mark.asyncio
async def test_a_warm_started_job_records_the_base_model_before_it_once_outside_the_stopping_series(tmp_path):
    """The curve shows what each stage did: the base model at step -1 (measured once, a resume finds it), the
    warm-started policy at step 0; the stopping rules' series starts at step 0, and the job reports both."""
    engine = _new_store(tmp_path)
    job_id = _submit(engine, {**TINY_RUN, "training": {**TINY_RUN["training"], "warm_start_examples": 256}})

    order: list[tuple[str, int | None]] = []

    def crash_in_the_warm_start(kind, data):
        order.append((kind, data.get("step")))
        if kind == "warm_start":
            raise Crash

    with pytest.raises(Crash):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=crash_in_the_warm_start))
    seen = JobHooks(on_event=lambda kind, data: order.append((kind, data.get("step"))))
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=seen)
    stages = [kind if kind == "warm_start" else step for kind, step in order if kind in ("warm_start", "validation")]
    assert stages[:2] == [BASE_STEP, "warm_start"] and stages[-4:] == ["warm_start", 0, 2, 4], stages
    assert job.status is JobStatus.succeeded and job.step == 4
    with Session(engine) as session:
        every = runs.validation_points(session, job_id=job_id, with_base=True)
        policy = runs.validation_points(session, job_id=job_id)
        validations = [e.step for e in events_after(session, job_id=job_id) if e.kind == "validation"]
        base_rows = runs.example_results(session, job_id=job_id, step=BASE_STEP)
    assert [p.step for p in every] == [BASE_STEP, 0, 2, 4] and [p.step for p in policy] == [0, 2, 4]
    assert validations == [BASE_STEP, 0, 2, 4]  # the resume did not measure the base model again
    base, step0 = every[0], every[1]
    assert job.base_val_accuracy == base.accuracy and job.step0_val_accuracy == step0.accuracy
    assert len(base_rows) == 8 and sum(base.outcomes.values()) == 8
    assert step0.best_step == 0 and step0.evaluations_without_gain == 0  # folded from nothing, not from the base
    assert job.best_step in (0, 2, 4)


@pytest.mark.asyncio
async def test_a_job_without_a_warm_start_measures_no_base_model(tmp_path):
    engine = _new_store(tmp_path)
    job_id = _submit(engine, TINY_RUN)  # warm_start_examples 0
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data")
    with Session(engine) as session:
        assert runs.base_point(session, job_id=job_id) is None
    assert job.base_val_accuracy is None and job.step0_val_accuracy is not None


def test_the_openings_few_shot_turns_are_not_counted_as_demonstrated_replies():
    demos = list(MathEnvironment().demonstrations(seed=0, count=640))  # each: two example replies, then its own
    assert warm_start_batch_size(demos) == WARM_START_TURNS_PER_BATCH
    assert warm_start_batch_size(demos, PRETRAINED_TURNS_PER_BATCH) == PRETRAINED_TURNS_PER_BATCH


@pytest.mark.asyncio
async def test_a_job_on_the_transformers_backend_runs_checkpoints_and_resumes(tmp_path, tiny_lm):
    """The whole loop on a real (tiny, random) LM: its server, validation, PEFT checkpoints pruned as the loop says,
    and a crash after step 2 resumed from step 2's adapter."""
    from service.backends import layout

    engine = _new_store(tmp_path)
    spec = {**TINY_RUN, "model": {"backend": "transformers", "base_model": str(tiny_lm)},
            "training": {**TINY_RUN["training"], "max_steps": 3, "group_size": 2}, "validation": {"every_n_steps": 1, "max_examples": 3, "patience": 10}}  # fmt: skip
    job_id = _submit(engine, spec)

    def crash_after_step_2(kind, data):
        if kind == "step" and data["step"] == 2:
            raise Crash

    with pytest.raises(Crash):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=crash_after_step_2))
    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data")
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.max_steps and job.step == 3
    steps, points = _history(engine, job_id)
    assert [s[0] for s in steps] == [1, 2, 3] and [p[0] for p in points] == [0, 1, 2, 3]
    model_dir = layout.model_dir(tmp_path / "data" / "models", layout.job_model_name(job_id, "demo"))
    kept = layout.checkpoint_steps(model_dir)
    assert kept[0] == 0 and kept[-2:] == [2, 3] and set(kept) <= {0, 1, 2, 3}
    assert (layout.checkpoint_dir(model_dir, 3) / "adapter_config.json").is_file()
