"""The baseline a job may name (``validation.baseline_model``): an API model measured on the job's own validation
examples, as an evaluation job of the job, so the job can stop once it beats it."""

from __future__ import annotations

from pathlib import Path

from service.evaluation.runner import evaluate_into
from service.settings import Settings
from service.spec import EvaluationSpec, LitellmModel
from service.store import runs
from service.store.tables import JobStatus
from service.training.run import Run


async def baseline_accuracy(run: Run, settings: Settings, data_dir: Path) -> float | None:
    """The baseline model's accuracy on the job's validation examples, measured once as an evaluation job of
    this job (re-measured if a crash interrupted it); None when the job names no baseline."""
    v, spec = run.spec.validation, run.spec
    if v.baseline_model is None:
        return None
    with run.write() as session:
        evaluation = runs.baseline_evaluation(session, job_id=run.job_id)
        if evaluation is not None and evaluation.status == JobStatus.succeeded and evaluation.summary:
            return evaluation.summary["pass_rate"]
        eval_spec = EvaluationSpec(model=LitellmModel(litellm=v.baseline_model), environment=spec.environment,
                                   environment_args=spec.environment_args, split="val", max_examples=v.max_examples,
                                   temperature=v.temperature, seed=spec.seed)  # fmt: skip
        if evaluation is None:
            job = runs.get_job(session, job_id=run.job_id)
            evaluation = runs.create_evaluation(session, spec=eval_spec, environment=spec.environment,
                                                owner_id=job.owner_id, parent_id=job.id)  # fmt: skip
        runs.mark_running(session, job=evaluation)  # running without a lease: no worker claims it from this job
    run.on_event("baseline", {"model": v.baseline_model, "evaluation_id": evaluation.id})
    ended = await evaluate_into(evaluation.id, eval_spec, db=run.db, data_dir=data_dir, settings=settings,
                                hooks=run.hooks)  # stopped, and written, as the job it measures for  # fmt: skip
    accuracy = ended.summary["pass_rate"]
    run.on_event("baseline", {"model": v.baseline_model, "evaluation_id": evaluation.id, "accuracy": accuracy})
    return accuracy
