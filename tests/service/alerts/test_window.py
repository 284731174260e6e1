"""check_alerts reads a bounded window of recent rows; the alerts it stores over a job, called after each new row
as the training loop calls it, are exactly the ones the rules give over the whole series. On real stores (SQLite,
and PostgreSQL when reachable), over random series that make every rule fire."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, select

from service.alerts import check_alerts
from service.alerts.rules import StepPoint, ValPoint, evaluate
from service.spec import AlertSpec, JobSpec, ValidationSpec
from service.store import runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import Alert

REWARDS = st.sampled_from([0.1, 0.1, 0.12, 0.12, 0.5, 0.55, 0.0, 1.0])  # flat runs, jumps, rises and falls
ACCURACIES = st.sampled_from([0.3, 0.4, 0.5, 0.505, 0.6, 0.7])


@st.composite
def series(draw: st.DrawFn) -> dict[str, Any]:
    """Alert thresholds, and steps 1..n, each with its metrics and maybe a validation point after it."""
    spec = JobSpec(
        environment="math",
        validation=ValidationSpec(patience=draw(st.integers(1, 3)), min_delta=draw(st.sampled_from([0.0, 0.01, 0.05]))),
        alerts=AlertSpec(divergence_window=draw(st.integers(2, 4)), reward_plateau_steps=draw(st.integers(2, 4)),
                         judge_agreement_window=draw(st.integers(1, 3)), collapse_fraction=0.5, judge_failure_rate=0.3,
                         rearm_steps=draw(st.integers(1, 8))),
    )  # fmt: skip
    # reward rising while validation falls, for long stretches: divergence after divergence
    hacking = draw(st.booleans())
    # validation at every step: the divergence span is then shorter than the step window
    validate_one_in = draw(st.sampled_from([1, 3]))
    # judged steps far apart: the judged window then reaches back past the other rows read
    judged_every = draw(st.sampled_from([1, 3, 8]))
    steps, accuracy = [], 0.9
    for step in range(1, draw(st.integers(1, 40)) + 1):
        judged = draw(st.integers(0, 3))
        metrics = {"judge_groups": float(judged), "judge_dropped_groups": float(draw(st.integers(0, judged)))}
        if judged and step % judged_every == 0:  # and some have no agreement (constant rewards)
            metrics["judge_agreement"] = draw(st.sampled_from([-0.5, -0.1, 0.2, 0.8]))
        reward = step / 50 if hacking else draw(REWARDS)
        values = {"reward_mean": reward, "reward_std": 0.1, "groups": 4, "zero_variance_groups": draw(st.integers(0, 4)),
                  "kl": draw(st.sampled_from([0.1, 0.6])), "completion_length": 9.0, "wall_time_s": 1.0,
                  "metrics": metrics if draw(st.booleans()) else {}}  # fmt: skip
        if draw(st.integers(1, validate_one_in)) == 1:
            accuracy = accuracy - draw(st.sampled_from([0.0, 0.02, 0.05])) if hacking else draw(ACCURACIES)
            steps.append((step, values, accuracy))
        else:
            steps.append((step, values, None))
    return {"spec": spec, "step0_accuracy": 0.9 if hacking else draw(ACCURACIES), "steps": steps}


def point(values: dict, step: int) -> StepPoint:
    m = values["metrics"]
    return StepPoint(step, values["reward_mean"], values["groups"], values["zero_variance_groups"], values["kl"],
                     int(m.get("judge_groups", 0)), int(m.get("judge_dropped_groups", 0)), m.get("judge_agreement"))  # fmt: skip


def validation(accuracy: float) -> dict:
    return {"accuracy": accuracy, "examples": 8, "temperature": 1.0, "wall_time_s": 1.0}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=series())
def test_the_windowed_alerts_of_a_job_are_those_of_its_whole_series(engine, drawn):
    spec = drawn["spec"]
    with Session(engine, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=spec)  # a new job each example: the store's rows of the others stay apart
        runs.mark_running(session, job=job)
        runs.record_validation(session, job=job, step=0, values=ValidationCreate(**validation(drawn["step0_accuracy"])))
        check_alerts(session, job=job, spec=spec)
        session.commit()
        for step, values, accuracy in drawn["steps"]:  # as the loop records: a step, then maybe its validation
            runs.record_step(session, job=job, step=step, values=StepCreate(**values))
            check_alerts(session, job=job, spec=spec)
            if accuracy is not None:
                runs.record_validation(session, job=job, step=step, values=ValidationCreate(**validation(accuracy)))
                check_alerts(session, job=job, spec=spec)
            session.commit()
        stored = session.exec(select(Alert).where(Alert.job_id == job.id)).all()

    steps = [point(values, step) for step, values, _ in drawn["steps"]]
    points = [ValPoint(0, drawn["step0_accuracy"])] + [ValPoint(s, a) for s, _, a in drawn["steps"] if a is not None]
    expected = evaluate(steps, points, alerts=spec.alerts, validation=spec.validation)
    as_stored = sorted((a.kind, a.step, a.message, a.evidence) for a in stored)
    assert as_stored == sorted((c.kind, c.step, c.message, c.evidence) for c in expected)
