"""The store's data functions and migrations on real databases: SQLite always, PostgreSQL when reachable."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from service import auth
from service.spec import EvaluationSpec, JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import JobStatus, Role, StopReason


def test_unmigrated_database_is_refused_with_what_to_run(database_url):
    engine = store_db.make_engine(database_url)
    with pytest.raises(store_db.StoreError, match="artsvc db upgrade"):
        store_db.check_migrated(engine)
    store_db.upgrade(database_url)
    store_db.check_migrated(engine)  # now at head
    engine.dispose()


def test_migrations_go_down_and_up_again(database_url):
    store_db.upgrade(database_url)
    command.downgrade(store_db.alembic_config(database_url), "base")
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    store_db.check_migrated(engine)
    engine.dispose()


def test_a_run_is_recorded_step_by_step_and_trimmed_on_resume(database_url):
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        runs.mark_running(session, job=job)
        for step in (1, 2, 3):
            values = {"reward_mean": step / 10, "reward_std": 0.1, "groups": 8, "zero_variance_groups": 1,
                      "completion_length": 9.0, "wall_time_s": 1.0, "metrics": {"loss": 0.5}}  # fmt: skip
            runs.record_step(session, job=job, step=step, values=StepCreate(**values))
        for step, accuracy in ((0, 0.5), (2, 0.6)):
            values = {"accuracy": accuracy, "greedy_accuracy": 0.9, "examples": 200, "temperature": 1.0,
                      "outcomes": {"correct": int(accuracy * 200)}, "wall_time_s": 2.0}  # fmt: skip
            runs.record_validation(session, job=job, step=step, values=ValidationCreate(**values))
        session.commit()
        assert runs.last_recorded_step(session, job_id=job.id) == 3 and job.step == 3

        runs.discard_after(session, job=job, step=1)
        session.commit()
        assert [s.step for s in runs.steps(session, job_id=job.id)] == [1]
        assert [p.step for p in runs.validation_points(session, job_id=job.id)] == [0]
        assert runs.steps(session, job_id=job.id)[0].metrics == {"loss": 0.5}

        runs.finish_job(session, job=job, status=JobStatus.succeeded, stop_reason=StopReason.plateau,
                        best_step=0, best_val_accuracy=0.5, step0_val_accuracy=0.5)  # fmt: skip
        session.commit()
        stored = runs.get_job(session, job_id=job.id)
        assert stored.status is JobStatus.succeeded and stored.stop_reason is StopReason.plateau
        assert stored.finished_at is not None and stored.spec["environment"] == "math"
        with Session(engine) as fresh:  # read back from the database, not the session's memory
            reloaded = runs.get_job(fresh, job_id=job.id)
            assert reloaded.created_at.utcoffset().total_seconds() == 0  # aware UTC, SQLite included
            assert reloaded.finished_at >= reloaded.created_at

        values = {"reward_mean": 0, "reward_std": 0, "groups": 8, "zero_variance_groups": 0,
                  "completion_length": 9.0, "wall_time_s": 1.0}  # fmt: skip
        runs.record_step(session, job=job, step=1, values=StepCreate(**values))
        with pytest.raises(IntegrityError):  # one row per step, enforced by the database
            session.commit()
    engine.dispose()


def test_a_budget_stop_is_stored_and_survives_a_downgrade_as_an_error(database_url):
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        runs.finish_job(session, job=job, status=JobStatus.succeeded, stop_reason=StopReason.budget, best_step=None,
                        best_val_accuracy=None, step0_val_accuracy=None)  # fmt: skip
        session.commit()
        job_id = job.id
    with Session(engine) as session:
        assert runs.get_job(session, job_id=job_id).stop_reason is StopReason.budget
    engine.dispose()
    command.downgrade(store_db.alembic_config(database_url), "0002")
    engine = store_db.make_engine(database_url)
    with engine.connect() as connection:
        row = connection.exec_driver_sql(f"SELECT stop_reason, error FROM jobs WHERE id = '{job_id}'").one()
    engine.dispose()
    assert tuple(row) == ("error", "stopped: judge budget reached")
    store_db.upgrade(database_url)


def test_evaluations_and_beat_baseline_stops_are_stored_and_a_downgrade_keeps_the_training_jobs(database_url):
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        runs.finish_job(session, job=job, status=JobStatus.succeeded, stop_reason=StopReason.beat_baseline)
        evaluation = runs.create_evaluation(session, spec=EvaluationSpec.model_validate(
            {"model": {"litellm": "openai/x"}, "environment": "math"}), environment="math", parent_id=job.id)  # fmt: skip
        session.flush()
        row = {"position": 0, "scenario_id": "math-val-00000", "outcome": "correct", "correct": True, "reward": 1.0,
               "completion": "Final: 94", "completion_tokens": 9, "details": {"why": "ok"}}  # fmt: skip
        runs.record_example_results(session, job=evaluation, step=0, rows=[row])
        session.commit()
        job_id = job.id
    with Session(engine) as session:
        assert runs.get_job(session, job_id=job_id).stop_reason is StopReason.beat_baseline
        stored = runs.baseline_evaluation(session, job_id=job_id)
        assert stored.kind == "evaluation" and runs.example_results(session, job_id=stored.id, step=0)[0].completion == "Final: 94"
    engine.dispose()
    command.downgrade(store_db.alembic_config(database_url), "0003")
    engine = store_db.make_engine(database_url)
    with engine.connect() as connection:
        rows = connection.exec_driver_sql("SELECT id, stop_reason FROM jobs").all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [(job_id, "target")]
    store_db.upgrade(database_url)


def test_browser_sessions_are_stored_and_a_downgrade_drops_them_but_keeps_the_tokens(database_url):
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine) as session:
        token, secret = auth.create_token(session, role=Role.client, name="browser")
        session.flush()
        _, cookie = auth.create_browser_session(session, token=secret, ttl_s=60)
        session.commit()
        assert auth.authenticate_browser_session(session.connection(), secret=cookie).id == token.id
    engine.dispose()
    command.downgrade(store_db.alembic_config(database_url), "0004")
    engine = store_db.make_engine(database_url)
    assert "browser_sessions" not in inspect(engine).get_table_names()
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT name FROM api_tokens").all() == [("browser",)]
    engine.dispose()
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine) as session:
        assert auth.authenticate_browser_session(session.connection(), secret=cookie) is None  # logged out by the downgrade
        assert auth.create_browser_session(session, token=secret, ttl_s=60) is not None
    engine.dispose()
