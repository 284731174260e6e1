"""A job through the whole service as a user runs it: `artsvc serve` (the API and its worker process),
`artsvc submit`, `artsvc watch`; it stops on plateau, and every number watch showed is in the store."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from sqlmodel import Session

from service.store import db as store_db
from service.store import runs

SPEC = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {"warm_start_examples": 0, "max_steps": 20, "groups_per_step": 2, "group_size": 4},
    # the first evaluation after step 0 plateaus
    "validation": {"every_n_steps": 2, "max_examples": 8, "patience": 1, "min_delta": 1.0},
}
VALIDATION_LINE = re.compile(r"step (\d+): val accuracy (\d\.\d{3}) \(greedy (\d\.\d{3})\)")


@pytest.mark.timeout(300)
def test_a_job_submitted_over_http_stops_on_plateau_and_watch_shows_what_the_store_holds(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update(ARTSVC_DATA_DIR=str(tmp_path / "data"), ARTSVC_API_URL=f"http://127.0.0.1:{port}",
               ARTSVC_WORKER_CPU_POLICY="nice")  # not SCHED_IDLE: the suite's other process keeps the cores busy
    cli = [sys.executable, "-m", "service"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until a worker is alive too ("degraded" before)
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                if health.status_code == 200 and health.json()["status"] == "ok":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        (tmp_path / "spec.json").write_text(json.dumps(SPEC))
        submitted = subprocess.run(
            [*cli, "submit", str(tmp_path / "spec.json")],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]
        watched = subprocess.run(
            [*cli, "watch", job_id, "--json"], check=False, env=env, capture_output=True, text=True, timeout=240
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert watched.returncode == 0, watched.stderr
    final = json.loads(watched.stdout.strip().splitlines()[-1])
    shown = [(int(s), float(a), float(g)) for s, a, g in VALIDATION_LINE.findall(watched.stderr)]

    engine = store_db.make_engine(f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}")
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        stored = [
            (p.step, round(p.accuracy, 3), round(p.greedy_accuracy, 3))
            for p in runs.validation_points(session, job_id=job_id)
        ]
        steps = [s.step for s in runs.steps(session, job_id=job_id)]
    engine.dispose()
    assert (
        job.status.value == final["status"] == "succeeded"
        and job.stop_reason.value == final["stop_reason"] == "plateau"
    )
    assert shown == stored == [(0, *stored[0][1:]), (2, *stored[1][1:])]
    assert steps == [1, 2] and final["step"] == job.step == 2
    assert final["best_val_accuracy"] == job.best_val_accuracy and final["best_step"] == job.best_step
