"""Evaluation jobs: one model on one split, measured and stored, nothing trained.

The model is a training job's checkpoint (served by the job's own backend at ``name@step``) or any
litellm model behind an OpenAI-compatible endpoint the operator configures (a baseline). Each example
is sampled ``n`` times; the first sample uses the validation seed of that example, so a checkpoint
evaluated on val with n=1 reproduces the job's own validation point. With n > 1 the best sample by
reward is selected (service/evaluation/selection.py) and the numbers are labelled as selection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import art
import litellm
from sqlalchemy.engine import Engine
from sqlmodel import Session

from environments.base import Environment, Sampling
from service import manifests
from service.backends import make_backend, precision_of
from service.backends.models import checkpoint_model, trainable_model
from service.evaluation.plan import EvaluationError, Resolved, manifest_for, resolve
from service.evaluation.results import completion_text, completion_tokens, example_row, sum_logprob, summarize
from service.evaluation.selection import Candidate, select
from service.runner import stopping
from service.runner.control import JobHooks, JobInterrupted, fenced, interrupt_if_asked
from service.runner.finish import finish
from service.runner.seeding import derive_seed
from service.settings import Settings, get_settings
from service.spec import CheckpointModel, EvaluationSpec, JobSpec
from service.store import runs
from service.store.events import append_event
from service.store.tables import Job, JobStatus, StopReason

CONCURRENCY = 32  # rollouts in flight at once: a provider's rate limit, not the embedded server, is the bound
PROGRESS_EVENTS = 10  # progress events an evaluation records (each tenth of its examples)


def litellm_model(name: str, settings: Settings) -> art.Model:
    """An ART model whose OpenAI client talks to the endpoint serving the litellm model ``name``."""
    try:
        model, provider, key, api_base = litellm.get_llm_provider(name, api_base=settings.baseline_api_base)
    except Exception as exc:  # litellm raises its own BadRequestError for a provider it does not know
        raise EvaluationError(f"litellm cannot route {name!r}: {exc}") from None
    if settings.baseline_api_key is not None:
        key = settings.baseline_api_key.get_secret_value()
    if api_base is None:
        raise EvaluationError(f"no endpoint known for {name!r} (provider {provider}); set ARTSVC_BASELINE_API_BASE")
    return art.Model(name=name.replace("/", "--"), project="artsvc", inference_model_name=model,
                     inference_base_url=api_base, inference_api_key=key or "unset")  # fmt: skip


class EvaluationCancelled(Exception):
    """The evaluation was cancelled while it ran; ``reason`` is the stop it records."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


async def _sample_all(env: Environment, model: art.Model, rows: list[dict[str, Any]], *, split: str, n: int,
                      temperature: float, seed: int, progress: Callable[[int], None]) -> list[list[art.Trajectory]]:  # fmt: skip
    """``n`` rollouts per row, seeded per example and sample; sample 0 uses the row's validation seed.
    ``progress(done)``, called as each rollout ends (a boundary), raises EvaluationCancelled or JobInterrupted to
    stop: rollouts not yet started are not, and that exception is raised once those in flight end."""
    limit = asyncio.Semaphore(CONCURRENCY)
    done, stop = 0, None

    async def one(row: dict[str, Any], i: int) -> art.Trajectory:
        nonlocal done, stop
        parts = (seed, split, row["id"]) if i == 0 else (seed, split, row["id"], i)
        async with limit:
            if stop is not None:
                raise stop
            trajectory = await env.rollout(model, row, Sampling(temperature=temperature, seed=derive_seed(*parts)))
        done += 1
        try:
            if stop is None:
                progress(done)
        except (EvaluationCancelled, JobInterrupted) as exc:
            stop = exc
        return trajectory

    results = await asyncio.gather(*(one(row, i) for row in rows for i in range(n)), return_exceptions=True)
    if stop is not None:
        raise stop
    if failures := [r for r in results if isinstance(r, BaseException)]:
        raise failures[0]
    return [list(results[k * n : (k + 1) * n]) for k in range(len(rows))]


def _candidates(env: Environment, trajectories: list[art.Trajectory]) -> list[Candidate]:
    return [
        Candidate(index=i, completion=completion_text(t), reward=t.reward,
                  correct=bool(env.is_correct(t)), sum_logprob=sum_logprob(t))  # fmt: skip
        for i, t in enumerate(trajectories)
    ]


async def measure(
    spec: EvaluationSpec, resolved: Resolved, model: art.Model, progress: Callable[[int, int], None]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample, select and summarise: the evaluation's summary and its per-example rows."""
    started = time.monotonic()
    env = resolved.env
    rows = list(env.scenarios(spec.split))[: spec.max_examples]
    total = len(rows) * spec.n
    sampled = await _sample_all(env, model, rows, split=spec.split, n=spec.n, temperature=resolved.temperature,
                                seed=resolved.seed, progress=lambda done: progress(done, total))  # fmt: skip
    ks = sorted(set(spec.ks if spec.ks is not None else (1, spec.n)))
    candidates = [_candidates(env, trajectories) for trajectories in sampled]
    report = select(candidates, ks=ks)
    results = []
    for position, (row, trajectories, options, chosen) in enumerate(zip(rows, sampled, candidates, report.selected)):
        result = example_row(env, trajectories[chosen.index], position=position, scenario_id=str(row["id"]))
        result["samples"], result["correct_samples"] = spec.n, sum(c.correct for c in options)
        if spec.n > 1:
            result["details"]["candidates"] = [{"index": c.index, "reward": c.reward, "correct": c.correct,
                                                "sum_logprob": c.sum_logprob} for c in options]  # fmt: skip
        results.append(result)
    tokens = [completion_tokens(t) for trajectories in sampled for t in trajectories]
    summary = {
        **summarize(results),
        "n": spec.n,
        "pass_at_k": {str(k): v for k, v in report.pass_at.items()},
        "selection": report.label if spec.n > 1 else None,
        "selection_digest": report.digest,
        "tokens_generated": None if any(t is None for t in tokens) else sum(tokens),
        "wall_time_s": time.monotonic() - started,
    }
    return summary, results


async def run_evaluation(
    job_id: str, *, db: Engine, data_dir: Path, settings: Settings | None = None, hooks: JobHooks | None = None
) -> Job:
    """Run a queued (or re-claimed) evaluation to its recorded end; a failure is recorded and re-raised (the runner
    shape of service/runner/finish.py). ``hooks`` steer it as they steer a training job: JobInterrupted (or
    LeaseLost) leaves it unrecorded, to start over."""
    hooks = hooks or JobHooks()
    with fenced(db, hooks, job_id) as session:
        job = runs.start_run(session, job_id=job_id)
    spec = EvaluationSpec.model_validate(job.spec)
    return await evaluate_into(job_id, spec, db=db, data_dir=data_dir, settings=settings or get_settings(), hooks=hooks)


async def evaluate_into(
    job_id: str, spec: EvaluationSpec, *, db: Engine, data_dir: Path, settings: Settings, hooks: JobHooks | None = None
) -> Job:
    """Measure ``spec`` and record it on the evaluation ``job_id`` (already marked running). Every rollout's end is
    a boundary where ``hooks.should_stop`` interrupts it; every write is fenced by ``hooks.holds_job``."""
    hooks = hooks or JobHooks()
    backend: art.Backend | None = None
    marks = set()

    def progress(done: int, total: int) -> None:
        """Record each tenth of the rollouts and read whether a cancel was asked for; at every rollout, whether
        the process asks the evaluation to stop."""
        interrupt_if_asked(hooks, job_id)
        mark = done * PROGRESS_EVENTS // max(1, total)
        if mark in marks:
            return
        marks.add(mark)
        with fenced(db, hooks, job_id) as session:
            append_event(session, job_id=job_id, kind="progress", data={"done": done, "total": total})
            cancel_requested = runs.get_job(session, job_id=job_id).cancel_requested
        if (reason := stopping.at_boundary(cancel_requested=cancel_requested)) is not None:
            raise EvaluationCancelled(reason)

    try:
        with fenced(db, hooks, job_id) as session:
            # Resolved again: the run needs the environment and the model, and what resolve checks may have changed
            # since submission (the baselines the operator allows, the evaluated job). The manifest is refreshed only.
            resolved = resolve(session, spec, settings)
            job = runs.get_job(session, job_id=job_id)
            job.manifest = manifests.refreshed(job.manifest, lambda: manifest_for(spec, resolved))
            session.add(job)
        with Session(db, expire_on_commit=False) as session:
            parent = runs.get_job(session, job_id=spec.model.job_id) if isinstance(spec.model, CheckpointModel) else None
        if parent is not None:
            job_spec = JobSpec.model_validate(parent.spec)
            backend = make_backend(job_spec.model.backend, data_dir=data_dir, seed=job_spec.seed,
                                   precision=settings.precision)  # fmt: skip
            with fenced(db, hooks, job_id) as session:  # what the checkpoint is computed in here, which only we know
                job = runs.get_job(session, job_id=job_id)
                job.manifest = manifests.with_precision(job.manifest, precision_of(backend))
                session.add(job)
            trainable = trainable_model(parent.id, job_spec, resolved.env, data_dir)
            await trainable.register(backend)
            model = checkpoint_model(trainable, resolved.model_section["step"])
        else:
            assert not isinstance(spec.model, CheckpointModel)
            model = litellm_model(spec.model.litellm, settings)
        measured = await measure(spec, resolved, model, progress)
        return finish(db, hooks, job_id, status=JobStatus.succeeded, stop_reason=None, measured=measured)
    except JobInterrupted:
        raise
    except EvaluationCancelled as cancelled:
        return finish(db, hooks, job_id, status=JobStatus.cancelled, stop_reason=cancelled.reason)
    except Exception as exc:
        finish(db, hooks, job_id, status=JobStatus.failed, stop_reason=None, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if backend is not None:
            await backend.close()
