"""``artsvc train``: submit a job as the API does (service/submission.py) and run it in this process."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlmodel import Session

from service import submission
from service.auth import LOCAL_PRINCIPAL
from service.backends.transformers.models import base_model_cache, converting_ahead
from service.cpu import wait_briefly
from service.gc_frozen import collector_paused
from service.settings import Settings, get_settings
from service.spec import JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.tables import BASE_STEP, Job, JobStatus

from service.cli.app import app, console, fail

JOB_FIELDS = (
    "id", "status", "environment", "step", "base_val_accuracy", "step0_val_accuracy", "best_val_accuracy", "best_step",
    "stop_reason", "error", "created_at", "started_at", "finished_at",
)  # fmt: skip


def job_summary(job: Job, *, database_url: str) -> dict[str, Any]:
    """A job as the API names its fields, plus where it is stored and how long it took."""
    data = job.model_dump(mode="json", include=set(JOB_FIELDS))
    summary = {field: data.get(field) for field in JOB_FIELDS}
    if job.started_at and job.finished_at:
        summary["wall_time_s"] = round((job.finished_at - job.started_at).total_seconds(), 1)
    summary["database_url"] = database_url
    return summary


def _val_text(point: dict[str, Any]) -> str:
    greedy = f" (greedy {point['greedy_accuracy']:.3f})" if point.get("greedy_accuracy") is not None else ""
    return f"val {point['accuracy']:.3f}{greedy}"


class TrainingDisplay:
    """Live progress of a training run on the terminal (stderr)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=console, transient=False,
        )  # fmt: skip
        self.warm = self.progress.add_task("warm start", total=None, info="", visible=False)
        self.train = self.progress.add_task("training", total=spec.training.max_steps, info="")
        self.last_val = "val -"

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "warm_start":
            loss = f"loss {data['loss']:.3f}" if data.get("loss") is not None else "cached"
            self.progress.update(self.warm, total=data["batches"], completed=data["batch"], info=loss, visible=True)
        elif kind == "step":
            info = f"reward {data['reward_mean']:.3f}  {self.last_val}"
            self.progress.update(self.train, completed=data["step"], info=info)
        elif kind == "validation" and data["step"] == BASE_STEP:
            self.progress.console.print(f"base model, before the warm start: {_val_text(data)}")
        elif kind == "validation":
            self.last_val = f"{_val_text(data)} @ {data['step']}"
            self.progress.update(self.train, completed=data["step"], info=self.last_val)
        elif kind == "judge_outage":
            self.progress.console.print(f"step {data['step']}: the judge scored no group, trying the step again: {data['failures'][:1]}")
        elif kind == "baseline" and data.get("accuracy") is not None:
            self.progress.console.print(f"baseline {data['model']}: val accuracy {data['accuracy']:.3f} (evaluation {data['evaluation_id']})")
        elif kind == "budget":
            self.progress.console.print(f"judge budget reached: ${data['judge_cost_usd']:.4f} of ${data['max_judge_cost_usd']}")


def _open_store(settings: Settings):
    url = settings.resolved_database_url
    try:
        store_db.upgrade(url)
        return store_db.make_engine(url)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None


@app.command()
def train(
    env: Annotated[Optional[str], typer.Option("--env", help="Environment to train on.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Training steps at most.")] = None,
    patience: Annotated[Optional[int], typer.Option(help="Evaluations without gain before stopping.")] = None,
    min_delta: Annotated[Optional[float], typer.Option(help="Smallest accuracy gain that counts.")] = None,
    target_accuracy: Annotated[Optional[float], typer.Option(help="Stop once validation reaches this.")] = None,
    target_gain: Annotated[
        Optional[float], typer.Option(help="Stop once validation is this far above step 0's (after the warm start).")
    ] = None,
    every_n_steps: Annotated[Optional[int], typer.Option(help="Validate every this many steps.")] = None,
    groups_per_step: Annotated[Optional[int], typer.Option(help="Scenarios per step.")] = None,
    group_size: Annotated[Optional[int], typer.Option(help="Rollouts per scenario.")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(help="RL learning rate.")] = None,
    val_examples: Annotated[Optional[int], typer.Option(help="Validation examples per evaluation.")] = None,
    greedy: Annotated[
        Optional[bool],
        typer.Option("--greedy/--no-greedy", help="Also validate greedily (default: yes, unless the environment says not)."),
    ] = None,
    env_arg: Annotated[
        Optional[list[str]],
        typer.Option("--env-arg", help="An environment argument as KEY=VALUE (repeatable), e.g. target_tile=64."),
    ] = None,
    base_model: Annotated[Optional[str], typer.Option(help="Base model (default: the environment's recommendation).")] = None,
    warm_start_examples: Annotated[
        Optional[int], typer.Option(help="Demonstrations for the warm start; 0 skips it (default: the environment's).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of everything random in the run.")] = 0,
    spec_file: Annotated[Optional[Path], typer.Option("--spec", help="A JobSpec JSON file; flags override it.")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Resume an interrupted job by id.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on the last line.")] = False,
) -> None:
    """Train a policy on an environment and stop on validation plateau, target or max steps."""
    wait_briefly()  # before torch loads: this process has the machine to itself
    settings = get_settings()
    engine = _open_store(settings)
    with Session(engine, expire_on_commit=False) as session:
        if resume:
            job = runs.get_job(session, job_id=resume)
            if job is None:
                raise fail(f"no job {resume!r} in {settings.resolved_database_url}")
            if job.status in (JobStatus.succeeded, JobStatus.cancelled):
                raise fail(f"job {resume} already ended ({job.status.value}); nothing to resume")
        else:
            flags = {
                "training": {"max_steps": max_steps, "groups_per_step": groups_per_step, "group_size": group_size,
                             "learning_rate": learning_rate, "warm_start_examples": warm_start_examples},
                "model": {"base_model": base_model},
                "validation": {"patience": patience, "min_delta": min_delta, "target_accuracy": target_accuracy,
                               "target_gain": target_gain, "every_n_steps": every_n_steps, "max_examples": val_examples,
                               "greedy": greedy},
            }  # fmt: skip
            spec = _build_spec(spec_file, env, seed, flags, _parse_env_args(env_arg or []))
            try:  # as the local operator: checked as the API checks an operator's job
                job, _ = submission.submit(session, spec, caller=LOCAL_PRINCIPAL, settings=settings)
            except submission.Refused as exc:
                raise fail(str(exc)) from None
    model = (job.manifest or {}).get("model") or {}
    with _base_model_converting_ahead(model, settings):
        summary = _run(job, engine, settings)
    _print_summary(summary)
    if as_json:
        typer.echo(json.dumps(summary))


def _base_model_converting_ahead(model: dict[str, Any], settings: Settings) -> AbstractContextManager[None]:
    """The transformers backend's base model converted from GGUF (where it is one, not converted yet) in a child
    process while this one imports torch and ART (models.converting_ahead)."""
    if model.get("backend") != "transformers" or not isinstance(model.get("base_model"), str):
        return nullcontext()
    return converting_ahead(model["base_model"], base_model_cache(settings.data_dir))


def _run(job: Job, engine: Any, settings: Settings) -> dict[str, Any]:
    """The job run to its end in this process, with its progress on the console; its summary."""
    # Imported only now, with the job in hand: torch and ART take seconds to load, which `artsvc --help` and
    # refused arguments need not wait for.
    with collector_paused():
        from service.backends import BackendUnavailableError
        from service.training.loop import JobHooks, run_job

    spec = JobSpec.model_validate(job.spec)
    console.print(f"job [bold]{job.id}[/bold]: {spec.environment} on the {spec.model.backend} backend")
    display = TrainingDisplay(spec)
    started = time.monotonic()
    try:
        with display.progress:
            hooks = JobHooks(on_event=display, trajectories_per_step=settings.trajectories_per_step)
            job = asyncio.run(run_job(job.id, db=engine, data_dir=settings.data_dir, hooks=hooks, settings=settings))
    except KeyboardInterrupt:
        raise fail(f"interrupted; resume with: artsvc train --resume {job.id}") from None
    except (BackendUnavailableError, store_db.StoreError) as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # the job row records it too
        raise fail(f"job {job.id} failed: {type(exc).__name__}: {exc}") from None
    summary = job_summary(job, database_url=settings.resolved_database_url)
    summary.setdefault("wall_time_s", round(time.monotonic() - started, 1))
    return summary


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that reads as JSON (64, 0.5, true) is taken as such, else as text."""
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise fail(f"--env-arg takes KEY=VALUE, got {pair!r}")
        try:
            args[key] = json.loads(text)
        except json.JSONDecodeError:
            args[key] = text
    return args


def _build_spec(
    spec_file: Optional[Path], env: Optional[str], seed: int, flags: dict[str, dict[str, Any]], env_args: dict[str, Any]
) -> JobSpec:
    """The JobSpec from the spec file (if any) with command-line flags on top; clear errors. Whether this server
    runs it is ``submission.submit``'s to say."""
    base: dict[str, Any] = {}
    if spec_file is not None:
        try:
            base = json.loads(spec_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise fail(f"cannot read the spec file {spec_file}: {exc}") from None
    if env is not None:
        base["environment"] = env
    if "environment" not in base:
        raise fail("say which environment to train on: --env NAME")
    for section, values in flags.items():
        for name, value in values.items():
            if value is not None:
                base.setdefault(section, {})[name] = value
    base.setdefault("seed", seed)
    if env_args:
        base["environment_args"] = {**base.get("environment_args", {}), **env_args}
    try:
        spec = JobSpec.model_validate(base)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise fail(f"invalid job spec: {problems}") from None
    return spec


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="training run", show_header=False)
    rows = [
        ("job", summary["id"]),
        ("status", summary["status"]),
        ("stop reason", summary["stop_reason"]),
        *([("base val accuracy (before warm start)", summary["base_val_accuracy"])]
          if summary["base_val_accuracy"] is not None else []),
        ("step-0 val accuracy", summary["step0_val_accuracy"]),
        ("best val accuracy", summary["best_val_accuracy"]),
        ("best step", summary["best_step"]),
        ("steps", summary["step"]),
        ("wall time (s)", summary.get("wall_time_s")),
        ("database", summary["database_url"]),
    ]
    for name, value in rows:
        table.add_row(name, f"{value:.3f}" if isinstance(value, float) and name != "wall time (s)" else str(value))
    console.print(table)
