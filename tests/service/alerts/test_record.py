"""check_alerts on real migrated stores (SQLite, and PostgreSQL when reachable): alerts stored once, with
their events, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from service.alerts import check_alerts
from service.spec import JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.events import events_after
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import Alert, Job

SPEC = JobSpec(environment="math")


@pytest.fixture
def engine(database_url) -> Iterator[Engine]:
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    yield engine
    engine.dispose()


def record_step(session: Session, job: Job, step: int, *, reward: float = 0.5, zero: int = 0) -> None:
    values = {"reward_mean": reward, "reward_std": 0.1, "groups": 8, "zero_variance_groups": zero, "kl": 0.1,
              "completion_length": 9.0, "wall_time_s": 1.0}  # fmt: skip
    runs.record_step(session, job=job, step=step, values=StepCreate(**values))


def record_validation(session: Session, job: Job, step: int, accuracy: float) -> None:
    values = {"accuracy": accuracy, "examples": 200, "temperature": 1.0, "wall_time_s": 2.0}
    runs.record_validation(session, job=job, step=step, values=ValidationCreate(**values))


def new_job(session: Session) -> Job:
    job = runs.create_job(session, spec=SPEC)
    runs.mark_running(session, job=job)
    session.commit()
    return job


def stored(engine: Engine, job_id: str) -> tuple[list[Alert], list]:
    """The job's alerts and alert events, read back by a fresh session."""
    with Session(engine) as session:
        alerts = list(session.exec(select(Alert).where(Alert.job_id == job_id)))
        events = [e for e in events_after(session, job_id=job_id) if e.kind == "alert"]
    return alerts, events


def test_a_collapse_is_stored_once_with_its_event(engine):
    with Session(engine, expire_on_commit=False) as session:
        job = new_job(session)
        fired = []
        for step, zero in ((1, 1), (2, 7)):  # 7 of 8 groups without reward variance at step 2
            record_step(session, job, step, zero=zero)
            fired.append(check_alerts(session, job=job, spec=SPEC))  # sees the row the session has not flushed
            session.commit()
        assert fired[0] == [] and [(a.kind, a.step) for a in fired[1]] == [("collapse", 2)]
        assert check_alerts(session, job=job, spec=SPEC) == []  # evaluated again: nothing new
        session.commit()

    alerts, events = stored(engine, job.id)
    assert [(a.kind, a.step, a.webhook_status) for a in alerts] == [("collapse", 2, None)]
    assert alerts[0].evidence == {"zero_variance_groups": 7, "groups": 8, "fraction": 0.875, "threshold": 0.75}
    assert [(e.step, e.data["id"], e.data["kind"]) for e in events] == [(2, alerts[0].id, "collapse")]
    assert events[0].data["evidence"] == alerts[0].evidence and events[0].data["message"] == alerts[0].message


def test_check_alerts_leaves_the_commit_to_its_caller(engine):
    with Session(engine, expire_on_commit=False) as session:
        job = new_job(session)
        record_step(session, job, 1, zero=8)
        assert [a.kind for a in check_alerts(session, job=job, spec=SPEC)] == ["collapse"]
        job_id = job.id
        session.rollback()  # the step, its alert and its event go together
    assert stored(engine, job_id) == ([], [])


def test_divergence_is_found_after_the_validation_point_that_completes_it(engine):
    with Session(engine, expire_on_commit=False) as session:
        job = new_job(session)
        fired = []
        record_validation(session, job, 0, 0.60)
        for step, reward, accuracy in ((1, 0.3, None), (2, 0.4, 0.55), (3, 0.5, None), (4, 0.6, 0.50)):
            record_step(session, job, step, reward=reward)
            fired += check_alerts(session, job=job, spec=SPEC)
            if accuracy is not None:
                record_validation(session, job, step, accuracy)
                fired += check_alerts(session, job=job, spec=SPEC)
            session.commit()
        assert [(a.kind, a.step) for a in fired] == [("divergence", 4)]
        assert runs.has_alert(session, job_id=job.id, kind="divergence")  # what the loop stops on

    alerts, events = stored(engine, job.id)
    evidence = alerts[0].evidence
    assert evidence["val_steps"] == [0, 2, 4] and evidence["val_accuracy"] == [0.6, 0.55, 0.5]
    assert evidence["reward_slope"] == pytest.approx(0.1) and evidence["reward_steps"] == 4
    assert [(e.step, e.data["kind"]) for e in events] == [(4, "divergence")]
