"""The training loop of one job, from warm start to a recorded stop.

It drives any ART backend through ART's Backend protocol (register, _train_sft, train) and logs
through ``model.log``. It records every step and validation point in the store and asks
service/runner/stopping.py whether to stop, after each validation and at each step boundary. It
resumes: re-running a job continues after the last step that both the store and the checkpoints hold,
with the same scenarios and seeds. The step itself is in step.py, validation in validation.py.
"""

from __future__ import annotations

from pathlib import Path

import art
from sqlalchemy.engine import Engine

import environments
from judges.ruler import RulerJudge
from judges.usage import BudgetSpent, JudgeBudget
from service import manifests
from service.backends import make_backend, precision_of
from service.backends.models import trainable_model
from service.runner import stopping
from service.runner.control import JobCancelled, JobHooks, JobInterrupted, fenced, interrupt_if_asked
from service.runner.finish import finish
from service.runner.stopping import Decision
from service.settings import Settings, get_settings
from service.spec import JobSpec
from service.store import runs
from service.store.tables import Job, JobStatus, StopReason
from service.training.baseline import baseline_accuracy
from service.training.judging import judge_for
from service.training.run import Run
from service.training.step import JudgeOutage, train_step
from service.training.validation import record_base_point, record_point
from service.training.warm_start import pending_examples, warm_start


async def run_job(
    job_id: str, *, db: Engine, data_dir: Path, settings: Settings | None = None, hooks: JobHooks | None = None
) -> Job:
    """Run (or resume) the job to a stop; the returned job row says how it ended (the runner shape of
    service/runner/finish.py). A job with a warm start validates the base model before it (step -1), then the
    warm-started policy at step 0.

    Failures inside the run are recorded on the job (status failed, stop reason error) and
    re-raised to the caller. An interruption (Ctrl-C, task cancellation, JobInterrupted from
    ``hooks.should_stop``, LeaseLost from ``hooks.holds_job``) records nothing: the job stays
    resumable from its last checkpointed step. A cancel requested through the store stops it as cancelled at the next
    step boundary, or within about a second inside a warm start, a step's rollouts or a validation.
    ``settings`` (default: the process's) say which judges the operator allows and where they are.
    """
    hooks = hooks or JobHooks()
    settings = settings or get_settings()
    with fenced(db, hooks, job_id) as session:
        job = runs.start_run(session, job_id=job_id)
        spent = runs.judge_spent_usd(session, job_id=job_id)
    spec = JobSpec.model_validate(job.spec)
    budget = JudgeBudget(spec.reward.max_judge_cost_usd, spent_usd=spent)
    backend: art.Backend | None = None
    try:
        env = environments.load(spec.environment, spec.environment_args)
        graded_against = {str(row["id"]): row for row in env.scenarios("train")} if spec.reward.mode == "grader" else {}
        judge = judge_for(spec.reward, settings, graded_against, budget)
        backend = make_backend(spec.model.backend, data_dir=data_dir, seed=spec.seed, precision=settings.precision,
                               activation_memory_gib=settings.activation_memory_gib)  # fmt: skip
        run = Run(job_id, spec, env, trainable_model(job_id, spec, env, data_dir), backend, db, hooks, judge, budget)
        _record_manifest(run)
        run.baseline_accuracy = await baseline_accuracy(run, settings, data_dir)
        await run.model.register(backend)
        if pending_examples(run):
            await record_base_point(run)
            await warm_start(run)
        step = await _resume_point(run)
        decision = await validate_if_due(run, step)
        while decision.stop_reason is None:
            if (reason := _at_boundary(run)) is not None:
                return _stop(run, step, decision, reason)
            try:
                step = await train_step(run, step + 1)
            except BudgetSpent:  # spent during the step, before any of its groups was judged: the step did not happen
                return _stop(run, step, decision, stopping.at_boundary(cancel_requested=False, budget_spent=True))
            decision = await validate_if_due(run, step)
            await _prune_checkpoints(run, step, decision.best_step)
        return finish(db, hooks, job_id, status=JobStatus.succeeded, stop_reason=decision.stop_reason, decision=decision)
    except JobInterrupted:
        raise
    except JobCancelled:  # seen inside a phase; what the phase did is dropped
        return finish(db, hooks, job_id, status=JobStatus.cancelled, stop_reason=StopReason.cancelled)
    except JudgeOutage as exc:  # the judge's failure, recorded as the job's stop; the worker goes on
        return finish(db, hooks, job_id, status=JobStatus.failed, stop_reason=StopReason.error, error=str(exc))
    except Exception as exc:
        finish(db, hooks, job_id, status=JobStatus.failed, stop_reason=StopReason.error, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if backend is not None:
            await backend.close()


def _record_manifest(run: Run) -> None:
    """What this run measures with: the manifest stored at submission, refreshed for the code of the process that
    trains it (manifests.refreshed), with that process's precision, judge verdict format and runtime, which only it
    knows."""
    exact = isinstance(run.judge, RulerJudge) and run.judge.config.exact_verdicts
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        stored = manifests.refreshed(job.manifest, lambda: manifests.training_manifest(run.spec, run.env))
        measured = manifests.with_verdict_format(manifests.with_precision(stored, precision_of(run.backend)), exact=exact)
        job.manifest = {**measured, "runtime": manifests.runtime()}
        session.add(job)


async def _resume_point(run: Run) -> int:
    """The last step both the checkpoints and the store hold; newer work on either side is dropped."""
    checkpoint_step = await run.model.get_step()
    with run.write() as session:
        job = runs.get_job(session, job_id=run.job_id)
        recorded_step = runs.last_recorded_step(session, job_id=run.job_id)
        step = min(checkpoint_step, recorded_step)
        runs.discard_after(session, job=job, step=step)
    if checkpoint_step > step:
        await run.backend._delete_checkpoint_files(run.model, list(range(step + 1)))
    return step


async def validate_if_due(run: Run, step: int) -> Decision:
    """Validate at ``step`` if due (every ``every_n_steps`` and at the last step), then decide from the series."""
    due = step % run.spec.validation.every_n_steps == 0 or step >= run.spec.training.max_steps
    latest = await record_point(run, step, due=due)
    return stopping.after_validation(
        runs.progress(latest),
        step=step,
        spec=run.spec,
        diverged=lambda: _diverged(run),
        baseline_accuracy=run.baseline_accuracy,
        first_accuracy=_first_accuracy(run),
    )


def _first_accuracy(run: Run) -> float | None:
    """The series' first point's accuracy, read only for a job with a ``target_gain`` (a resumed job reads it too)."""
    if run.spec.validation.target_gain is None:
        return None
    with run.session() as session:
        first = runs.first_point(session, job_id=run.job_id)
        return None if first is None else first.accuracy


def _diverged(run: Run) -> bool:
    with run.session() as session:
        return runs.has_alert(session, job_id=run.job_id, kind="divergence")


def _at_boundary(run: Run) -> StopReason | None:
    """Before a step: whether a cancel was asked through the store (it wins over an interruption: the job ends
    cancelled even while its process stops), else JobInterrupted if the process asks the job to stop, else
    whether the judge budget is spent."""
    cancel_requested = run.check_stop.cancel_requested()
    if not cancel_requested:
        interrupt_if_asked(run.hooks, run.job_id)
    return stopping.at_boundary(cancel_requested=cancel_requested, budget_spent=run.budget.spent)


def _stop(run: Run, step: int, decision: Decision, reason: StopReason) -> Job:
    """End the job at a boundary: cancelled, or succeeded with stop reason budget, its judge calls having spent
    ``reward.max_judge_cost_usd`` (the budget admits each call, so by at most about one call more: judges/usage.py)."""
    if reason is StopReason.budget:
        limit = run.spec.reward.max_judge_cost_usd
        run.on_event("budget", {"step": step, "judge_cost_usd": run.budget.spent_usd, "max_judge_cost_usd": limit})
    status = JobStatus.cancelled if reason is StopReason.cancelled else JobStatus.succeeded
    return finish(run.db, run.hooks, run.job_id, status=status, stop_reason=reason, decision=decision)


async def _prune_checkpoints(run: Run, step: int, best_step: int | None) -> None:
    """Keep the warm start, the best step, and the two newest (a resume may roll back one step)."""
    keep = {0, step - 1, step} | ({best_step} if best_step is not None else set())
    await run.backend._delete_checkpoint_files(run.model, sorted(keep))
