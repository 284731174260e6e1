"""Running totals on SQLite and PostgreSQL: a job's judge account and costs, read from its newest step's running
sums, are the very floats that summing every step row gives, before and after a resume discards steps; and the
migration fills them in for rows written before it."""

from __future__ import annotations

from alembic import command
from sqlmodel import Session

from service.spec import JobSpec, ValidationSpec
from service.store import db as store_db
from service.store import runs
from service.store.progress import fold
from service.store.records import StepCreate, StepJudge, ValidationCreate
from service.store.running import JUDGE_TOTALS

COSTS = [0.1, 0.2, 0.3, 0.7, 1e-9, 0.1]  # sums whose floats depend on the order they are added in


def step_values(step: int) -> dict:
    metrics = {"tokens_generated": 10.0 * step, "rollout_s": COSTS[step % 6], "judge_s": 0.01, "train_s": 0.3}
    if step % 3:  # two steps in three are judged
        metrics |= {"judge_cost_usd": COSTS[step % 6], "judge_prompt_tokens": 100.0, "judge_groups": 4.0,
                    "judge_dropped_groups": float(step % 2), "judge_agreement": 0.5}  # fmt: skip
    return {"reward_mean": 0.5, "reward_std": 0.1, "groups": 4, "zero_variance_groups": 0, "completion_length": 9.0,
            "wall_time_s": 1.0, "metrics": metrics}  # fmt: skip


def summed(rows: list[dict], unrecorded: list[dict]) -> dict:
    """The totals as summing every row gives them (what the service did before it kept running sums)."""
    judged = [m for m in rows if "judge_groups" in m] + unrecorded
    return {key: sum(float(m.get(key) or 0.0) for m in judged) for key in JUDGE_TOTALS}


def record(session: Session, job, steps: range, accuracies: list[float]) -> None:
    for step in steps:
        runs.record_step(session, job=job, step=step, values=StepCreate(**step_values(step)))
    for step, accuracy in enumerate(accuracies):
        values = {"accuracy": accuracy, "examples": 8, "temperature": 1.0, "wall_time_s": 2.0, "tokens_generated": 7}
        runs.record_validation(session, job=job, step=step, values=ValidationCreate(**values))


def test_totals_are_the_sums_of_the_rows_also_after_a_resume_discards_some(engine):
    with Session(engine, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        record(session, job, range(1, 13), [])
        spend = {"judge_cost_usd": 0.3, "judge_groups": 2.0, "judge_dropped_groups": 2.0}
        runs.record_judge_spend(session, job=job, step=13, judge=StepJudge.of_column(spend))  # a step the judge let down: no row
        session.commit()
        for kept in (12, 7):
            runs.discard_after(session, job=job, step=kept)
            session.commit()
            rows = [step_values(step)["metrics"] for step in range(1, kept + 1)]
            assert runs.judge_totals(session, job_id=job.id) == summed(rows, [spend])
            assert runs.judge_spent_usd(session, job_id=job.id) == summed(rows, [spend])["judge_cost_usd"]
            cost = runs.cost_totals(session, job_id=job.id)
            assert cost["tokens_generated_train"] == sum(10 * step for step in range(1, kept + 1))
            assert cost["wall_s"]["rollout"] == sum(m["rollout_s"] for m in rows)
            assert cost["judge_cost_usd"] == summed(rows, [spend])["judge_cost_usd"]


def test_nothing_judged_is_no_judge_account(engine):
    with Session(engine, expire_on_commit=False) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"))
        runs.record_step(session, job=job, step=1, values=StepCreate(**step_values(3)))  # step 3's metrics: not judged
        session.commit()
        assert runs.judge_totals(session, job_id=job.id) is None
        assert runs.cost_totals(session, job_id=job.id)["tokens_generated_train"] == 30


def test_the_migration_fills_in_the_running_state_of_rows_written_before_it(database_url):
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    accuracies = [0.5, 0.52, 0.54, 0.56, 0.58, 0.6]  # steady gains of 0.02: a plateau for min_delta 0.05 alone
    with Session(engine, expire_on_commit=False) as session:
        specs = [JobSpec(environment="math", validation=ValidationSpec(min_delta=d)) for d in (0.01, 0.05)]
        jobs = [runs.create_job(session, spec=spec) for spec in specs]
        for job in jobs:
            record(session, job, range(1, 8), accuracies)
        session.commit()

        def state() -> list:
            return [([(s.totals, s.judge_agreement) for s in runs.steps(session, job_id=job.id)],
                     [runs.progress(p) for p in runs.validation_points(session, job_id=job.id)]) for job in jobs]  # fmt: skip

        written = state()
    engine.dispose()
    command.downgrade(store_db.alembic_config(database_url), "0005")
    store_db.upgrade(database_url)
    engine = store_db.make_engine(database_url)
    with Session(engine, expire_on_commit=False) as session:
        assert state() == written
    engine.dispose()
    for (_, progress), spec in zip(written, specs):  # the fold of each job's own min_delta
        series = list(enumerate(accuracies))
        assert progress[-1] == fold(series, min_delta=spec.validation.min_delta)
    assert written[0][1][-1].evaluations_without_gain != written[1][1][-1].evaluations_without_gain
