"""``artsvc submit`` and ``artsvc watch`` as a user runs them: subprocesses talking to the real API
on loopback, against a real SQLite store (the API on PostgreSQL is tested in tests/service/api)."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlmodel import Session

from service.alerts.record import check_alerts
from service.auth import create_token
from service.spec import JobSpec
from service.store import runs
from service.store.records import StepCreate, ValidationCreate
from service.store.tables import Job, JobStatus, Role, StopReason
from tests.databases import sqlite_only  # the client's side of things: the API's store is tested in tests/service/api

TINY_SPEC = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {"warm_start_examples": 0, "max_steps": 4, "groups_per_step": 2, "group_size": 4},
    "validation": {"every_n_steps": 2, "max_examples": 8},
}
LINE_WAIT_S = 120  # a guard against a hung client, not a measurement
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing answers HTTP there


@pytest.fixture
def token(engine) -> tuple[str, str]:
    """A client token: (its id, which owns the jobs it submits; the secret)."""
    with Session(engine) as session:
        row, secret = create_token(session, role=Role.client, name="cli-test")
        session.commit()
        return row.id, secret


def command(*args: str, api_url: str, token: str | None) -> tuple[list[str], dict[str, str]]:
    """``python -m service ARGS`` with the API's URL and token in the environment, as a user sets them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env.update(ARTSVC_API_URL=api_url, **({"ARTSVC_TOKEN": token} if token else {}))
    return [sys.executable, "-m", "service", *args], env


def artsvc(*args: str, api_url: str, token: str | None, cwd: Path, stdin: str | None = None):
    argv, env = command(*args, api_url=api_url, token=token)
    return subprocess.run(argv, env=env, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=300)


def said(result: subprocess.CompletedProcess) -> str:
    """stderr with its line breaks and runs of spaces as single spaces (the console wraps long lines)."""
    return " ".join(result.stderr.split())


def stored_job(engine, job_id: str) -> Job | None:
    with Session(engine) as session:
        return runs.get_job(session, job_id=job_id)


@sqlite_only
def test_submit_prints_the_id_of_the_stored_job(live_server, engine, token, tmp_path):
    owner_id, secret = token
    (tmp_path / "spec.json").write_text(json.dumps(TINY_SPEC))
    result = artsvc("submit", "spec.json", api_url=live_server, token=secret, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.splitlines()[-1]
    job = stored_job(engine, job_id)
    assert job is not None and job.owner_id == owner_id and job.status is JobStatus.queued
    assert JobSpec.model_validate(job.spec) == JobSpec.model_validate(TINY_SPEC)
    assert f"artsvc watch {job_id}" in said(result)


@sqlite_only
def test_submit_reads_stdin_and_retries_idempotently(live_server, token, tmp_path):
    _, secret = token
    spec = json.dumps({"environment": "math"})
    first, again = (
        artsvc("submit", "-", "--idempotency-key", "k1", api_url=live_server, token=secret, cwd=tmp_path, stdin=spec)
        for _ in range(2)
    )
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert first.stdout.splitlines()[-1] == again.stdout.splitlines()[-1]
    assert "already submitted with this idempotency key" in said(again)


@sqlite_only
def test_flags_override_the_environment(live_server, token, tmp_path):
    _, secret = token
    (tmp_path / "spec.json").write_text(json.dumps(TINY_SPEC))
    flags = ["--api-url", live_server, "--token", secret]
    argv, env = command("submit", "spec.json", *flags, api_url=UNREACHABLE, token="wrong")
    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@sqlite_only
@pytest.mark.parametrize(
    ("spec_text", "message"),
    [
        (json.dumps({**TINY_SPEC, "training": {"group_size": 0}}), "training.group_size"),
        (json.dumps({"environment": "chess"}), "unknown environment 'chess'"),
        (json.dumps({"environment": "math", "colour": "blue"}), "colour"),
        (json.dumps([1, 2]), "expected a JSON object"),
    ],
)
def test_a_refused_spec_exits_2_with_the_apis_message(spec_text, message, live_server, token, tmp_path):
    (tmp_path / "spec.json").write_text(spec_text)
    result = artsvc("submit", "spec.json", api_url=live_server, token=token[1], cwd=tmp_path)
    assert result.returncode == 2
    assert "the API refused the job" in said(result) and message in said(result)
    assert result.stdout == "" and "Traceback" not in said(result)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the spec file spec.json"),
        ('{"environment": ', "is not valid JSON: Expecting value at line 1"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_an_unreadable_spec_file_is_explained(content, message, tmp_path):
    if isinstance(content, bytes):
        (tmp_path / "spec.json").write_bytes(content)
    elif content is not None:
        (tmp_path / "spec.json").write_text(content)
    result = artsvc("submit", "spec.json", api_url=UNREACHABLE, token="artsvc_x", cwd=tmp_path)
    assert result.returncode == 2 and message in said(result) and "Traceback" not in said(result)


@sqlite_only
def test_a_missing_token_is_explained(live_server, tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(TINY_SPEC))
    result = artsvc("submit", "spec.json", api_url=live_server, token=None, cwd=tmp_path)
    assert result.returncode == 2
    assert "missing bearer token" in said(result) and "ARTSVC_TOKEN" in said(result)


def test_an_unreachable_api_is_explained(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    (tmp_path / "spec.json").write_text(json.dumps(TINY_SPEC))
    for verb in (["submit", "spec.json"], ["watch", "some-job"]):
        result = artsvc(*verb, api_url=url, token="artsvc_x", cwd=tmp_path)
        assert result.returncode == 2
        assert f"cannot reach the API at {url}" in said(result) and "Traceback" not in said(result)


@sqlite_only
def test_watching_an_unknown_job_is_explained(live_server, token, tmp_path):
    result = artsvc("watch", "0b6c0b1e-0000-4000-8000-000000000000", api_url=live_server, token=token[1], cwd=tmp_path)
    assert result.returncode == 2 and "no job" in said(result)


def seed_job(engine, owner_id: str) -> str:
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec.model_validate(TINY_SPEC), owner_id=owner_id)
        session.commit()
        return job.id


STEP = {"reward_std": 0.1, "groups": 2, "zero_variance_groups": 0, "completion_length": 9.0, "wall_time_s": 0.1}
ACCURACIES = {0: 0.125, 2: 0.375, 4: 0.625}


def record(engine, job_id: str, *, steps: range, collapse_at: int | None = None) -> None:
    """Steps and validation points (ACCURACIES) as the training loop records them: each step's rows and
    the alerts they fire in one commit. At ``collapse_at`` every group has zero reward variance."""
    with Session(engine, expire_on_commit=False) as session:
        job = runs.get_job(session, job_id=job_id)
        spec = JobSpec.model_validate(job.spec)
        for step in steps:
            if step:
                flat = {"zero_variance_groups": STEP["groups"]} if step == collapse_at else {}
                runs.record_step(session, job=job, step=step, values=StepCreate(**{**STEP, "reward_mean": step / 10, **flat}))
            if step in ACCURACIES:
                values = {"accuracy": ACCURACIES[step], "greedy_accuracy": 0.5, "examples": 8, "temperature": 1.0,
                          "outcomes": {"correct": int(ACCURACIES[step] * 8)}, "wall_time_s": 0.1}  # fmt: skip
                runs.record_validation(session, job=job, step=step, values=ValidationCreate(**values))
            check_alerts(session, job=job, spec=spec)
            session.commit()


def finish(engine, job_id: str, *, status: JobStatus, stop_reason: StopReason, error: str | None = None) -> Job:
    with Session(engine, expire_on_commit=False) as session:
        job = runs.get_job(session, job_id=job_id)
        best_step, best = max(((s, a) for s, a in ACCURACIES.items() if s <= job.step), key=lambda point: point[1])
        runs.finish_job(session, job=job, status=status, stop_reason=stop_reason, best_step=best_step,
                        best_val_accuracy=best, step0_val_accuracy=ACCURACIES[0], error=error)  # fmt: skip
        session.commit()
        return job


def follow_lines(stream, into: list[str]) -> queue.Queue[str | None]:
    """Collect ``stream``'s lines in a thread; the queue yields each as it comes, then None at the end."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            into.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


@sqlite_only
def test_watch_follows_a_running_job_live_and_exits_with_it(live_server, engine, token, tmp_path):
    owner_id, secret = token
    job_id = seed_job(engine, owner_id)
    argv, env = command("watch", job_id, "--json", api_url=live_server, token=secret)
    watcher = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    lines = follow_lines(watcher.stderr, stderr)
    try:
        with Session(engine, expire_on_commit=False) as session:
            job = runs.get_job(session, job_id=job_id)
            job.worker_id = "test-worker"
            runs.mark_running(session, job=job)
            session.commit()
        while (line := lines.get(timeout=LINE_WAIT_S)) is None or "started at step 0 on worker test-worker" not in line:
            assert line is not None, "".join(stderr)  # the watcher ended before the job started
        # the watcher is connected and following: everything below happens while it watches
        record(engine, job_id, steps=range(0, 5), collapse_at=3)
        job = finish(engine, job_id, status=JobStatus.succeeded, stop_reason=StopReason.max_steps)
        watcher.wait(timeout=LINE_WAIT_S)
        stdout = watcher.stdout.read()
    finally:
        watcher.kill()
    while lines.get(timeout=LINE_WAIT_S) is not None:
        pass
    shown = "".join(stderr)
    assert watcher.returncode == 0, shown
    for step, accuracy in ACCURACIES.items():
        assert f"step {step}: val accuracy {accuracy:.3f}" in shown
    assert shown.count("val accuracy 0.375") == 1  # each event once
    assert shown.count("alert collapse at step 3: 2 of 2 groups have zero reward variance") == 1
    final = json.loads(stdout.splitlines()[-1])
    assert final["id"] == job_id and final["status"] == "succeeded"
    assert final["best_val_accuracy"] == job.best_val_accuracy == 0.625 and final["best_step"] == 4


@sqlite_only
def test_watching_an_ended_job_prints_its_history(live_server, engine, token, tmp_path):
    owner_id, secret = token
    job_id = seed_job(engine, owner_id)
    record(engine, job_id, steps=range(0, 3))
    finish(engine, job_id, status=JobStatus.failed, stop_reason=StopReason.error, error="boom")
    result = artsvc("watch", job_id, "--json", api_url=live_server, token=secret, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "step 0: val accuracy 0.125" in said(result) and "step 2: val accuracy 0.375" in said(result)
    assert "failed (stop: error) after 2 steps" in said(result) and "error: boom" in said(result)
    assert json.loads(result.stdout.splitlines()[-1])["status"] == "failed"
