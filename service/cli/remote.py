"""``artsvc submit`` and ``artsvc watch``, and what every verb that calls a server's HTTP API shares: the
``--api-url`` and ``--token`` options, the client they make, reading a JSON spec file.

Human output goes to stderr; stdout carries only what scripts read, as its last line: the job id
(submit) and, with ``--json``, the final job (watch). Refusals and unreachable APIs exit 2.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.api_client import ApiClient, ApiError
from service.sse import ServerSentEvent
from service.settings import get_settings

from service.cli.app import app, console, fail

ApiUrlOption = Annotated[
    Optional[str],
    typer.Option("--api-url", help="Base URL of the API (default: ARTSVC_API_URL, else http://127.0.0.1:8000)."),
]
TokenOption = Annotated[
    Optional[str], typer.Option("--token", help="Bearer token (default: ARTSVC_TOKEN, which keeps it out of `ps`).")
]


@app.command()
def submit(
    spec_file: Annotated[str, typer.Argument(metavar="SPEC.json", help="A JobSpec JSON file, or - to read stdin.")],
    idempotency_key: Annotated[
        Optional[str], typer.Option(help="A retry with the same key returns the first job instead of a second one.")
    ] = None,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a training job; prints its id as the last line of stdout."""
    spec = read_json_file(spec_file)
    with api_client(api_url, token, refused="the API refused the job") as client:
        job, replayed = client.submit(spec, idempotency_key=idempotency_key)
    how = "was already submitted with this idempotency key" if replayed else f"is {job['status']}"
    follow = f"follow it with: artsvc watch {job['id']}"
    console.print(f"job {job['id']} ({job['environment']}) {how}; {follow}", soft_wrap=True, highlight=False)
    typer.echo(job["id"])


@app.command()
def watch(
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID", help="The id `artsvc submit` printed.")],
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final job as JSON on the last line.")] = False,
) -> None:
    """Follow a job live until it ends; exit code 0 if it succeeded, 1 if it failed or was cancelled.

    Shows a bar of steps with reward and val accuracy, and each validation point and alert as it fires.
    """
    with api_client(api_url, token) as client:
        try:
            display = WatchDisplay(client.get_job(job_id))
            with display.progress:
                final = display.follow(client.events(job_id))
        except KeyboardInterrupt:
            console.print(f"stopped watching; the job goes on (artsvc watch {job_id} follows it again)", soft_wrap=True)
            raise typer.Exit(130) from None
    display.summary(final)
    if as_json:
        typer.echo(json.dumps(final))
    raise typer.Exit(0 if final["status"] == "succeeded" else 1)


class WatchDisplay:
    """A job's events on stderr: a bar of steps (with the latest reward and validation accuracy)
    and one line per lifecycle change, validation point and alert."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=console,
        )  # fmt: skip
        total = job["spec"]["training"]["max_steps"]
        self.bar = self.progress.add_task(f"job {job['id'][:8]}", total=total, info="")
        self.reward = self.val = "-"

    def follow(self, events: Iterable[ServerSentEvent]) -> dict[str, Any]:
        """Show every event until ``end``; returns the final job it carries."""
        for event in events:
            payload = _json(event.data)
            if event.event == "end":
                return payload
            self.show(event.event, step=payload.get("step"), data=payload.get("data") or {})
        raise ApiError("the event stream ended without the job's end")

    def show(self, kind: str, *, step: int | None, data: dict[str, Any]) -> None:
        step = step if step is not None else data.get("step")  # lifecycle events carry the job's step in data
        line = None
        if kind == "step":
            self.reward = _number(data.get("reward_mean"))
        elif kind == "validation":
            accuracy, greedy = _number(data.get("accuracy")), _number(data.get("greedy_accuracy"))
            self.val = f"{accuracy} @ {step}"
            line = f"step {step}: val accuracy {accuracy} (greedy {greedy}) on {data.get('examples')} examples"
        elif kind == "alert":
            line = f"[yellow]alert[/yellow] {_text(data.get('kind'))} at step {step}: {_text(data.get('message'))}"
        elif kind == "alert_acknowledged":
            line = f"alert {_text(data.get('kind'))} at step {data.get('alert_step')} acknowledged by an operator"
        elif kind in ("started", "resumed"):
            line = f"{kind} at step {step} on worker {_text(data.get('worker_id'))}"
        elif kind == "cancel_requested":
            line = "cancel requested: the job stops at its next step boundary"
        if isinstance(step, int):
            self.progress.update(self.bar, completed=step)
        self.progress.update(self.bar, info=f"reward {self.reward}  val {self.val}")
        if line:
            self.progress.console.print(line, soft_wrap=True, highlight=False)

    def summary(self, job: dict[str, Any]) -> None:
        colour = "green" if job["status"] == "succeeded" else "red"
        status = f"[{colour}]{job['status']}[/{colour}] (stop: {job['stop_reason']})"
        base = job.get("base_val_accuracy")
        warm_start = f"base model {_number(base)} before the warm start, " if base is not None else ""
        console.print(
            f"job {job['id']} {status} after {job['step']} steps; {warm_start}"
            f"val accuracy {_number(job['step0_val_accuracy'])} at step 0, best {_number(job['best_val_accuracy'])} "
            f"at step {job['best_step']}" + (f"; error: {_text(job['error'])}" if job.get("error") else ""),
            soft_wrap=True,
            highlight=False,
        )


@contextlib.contextmanager
def api_client(
    api_url: str | None, token: str | None, *, refused: str | None = None, timeout_s: float = 30.0
) -> Iterator[ApiClient]:
    """The verb's client of the API (flags first, then settings). An API error ends the verb with its message and
    exit code 2, after ``refused`` when the API answered (a refusal rather than an unreachable server)."""
    settings = get_settings()
    try:
        with ApiClient(base_url=api_url or settings.api_url, token=token or settings.token, timeout_s=timeout_s) as client:
            yield client
    except ApiError as exc:
        raise fail(f"{refused}: {exc}" if refused and exc.status else str(exc)) from None


def read_json_file(name: str) -> Any:
    """The JSON in the spec file (or stdin); the API judges whether it is a valid spec."""
    where = "stdin" if name == "-" else f"the spec file {name}"
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as exc:
        raise fail(f"cannot read {where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise fail(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise fail(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def _json(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        raise ApiError(f"the API sent an event that is not a JSON object: {text[:200]!r}")
    return payload


def _text(value: Any) -> str:
    """A value from the API shown literally (never read as console markup)."""
    return escape(str(value))


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"
