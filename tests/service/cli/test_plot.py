"""``artsvc plot`` as a user runs it: a subprocess downloading from the real API on loopback, or with ``--local``
reading the SQLite store ``artsvc train`` wrote; both write the same PNG, and refusals exit 2 with a reason."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.databases import sqlite_only
from tests.service.api import seeding

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
UNKNOWN_JOB = "0b6c0b1e-0000-4000-8000-000000000000"


def artsvc(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m service ARGS`` with only the ``ARTSVC_*`` variables given here."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")} | env
    argv = [sys.executable, "-m", "service", *args]
    return subprocess.run(argv, env=environ, cwd=cwd, capture_output=True, text=True, timeout=120)


def said(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stderr.split())


@pytest.fixture
def job(engine) -> tuple[str, str]:
    """A job with steps, validation points and an alert: its id and its owner's token."""
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    for step in range(4):
        seeding.record(engine, job_id, step, reward=step / 4, accuracy=step / 4 if step % 2 == 0 else None)
    seeding.alert(engine, job_id, kind="collapse", step=3)
    return job_id, headers["Authorization"].removeprefix("Bearer ")


@sqlite_only
def test_plot_downloads_the_apis_png_and_local_draws_the_same_from_the_store(live_server, database_url, job, tmp_path):
    job_id, token = job
    result = artsvc("plot", job_id, cwd=tmp_path, ARTSVC_API_URL=live_server, ARTSVC_TOKEN=token)
    assert result.returncode == 0, result.stderr
    default = tmp_path / f"curves-{job_id[:8]}.png"
    assert result.stdout.splitlines()[-1] == default.name and default.read_bytes().startswith(PNG_SIGNATURE)

    result = artsvc("plot", job_id, "--local", "-o", "local.png", cwd=tmp_path, ARTSVC_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "local.png").read_bytes() == default.read_bytes()


@sqlite_only
@pytest.mark.parametrize(
    ("job_id", "token", "message"),
    [(UNKNOWN_JOB, "owner", "no job"), ("job", "artsvc_wrong", "unknown or revoked token")],
)
def test_an_unknown_job_or_a_bad_token_exits_2(job_id, token, message, live_server, job, tmp_path):
    job_id = job[0] if job_id == "job" else job_id
    token = job[1] if token == "owner" else token
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = artsvc("plot", job_id, cwd=cwd, ARTSVC_API_URL=live_server, ARTSVC_TOKEN=token)
    assert result.returncode == 2 and message in said(result) and "Traceback" not in said(result)
    assert not list(cwd.iterdir())  # nothing written


def test_an_unreachable_api_exits_2(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = artsvc("plot", UNKNOWN_JOB, cwd=tmp_path, ARTSVC_API_URL=url, ARTSVC_TOKEN="artsvc_x")
    assert result.returncode == 2 and f"cannot reach the API at {url}" in said(result)


@sqlite_only
def test_local_explains_an_unknown_job_and_a_missing_store(database_url, job, tmp_path):
    result = artsvc("plot", UNKNOWN_JOB, "--local", cwd=tmp_path, ARTSVC_DATABASE_URL=database_url)
    assert result.returncode == 2 and f"no job '{UNKNOWN_JOB}'" in said(result)
    missing = tmp_path / "nowhere" / "artsvc.db"
    result = artsvc("plot", job[0], "--local", cwd=tmp_path, ARTSVC_DATABASE_URL=f"sqlite:///{missing}")
    assert result.returncode == 2 and "no store at" in said(result) and not missing.parent.exists()
