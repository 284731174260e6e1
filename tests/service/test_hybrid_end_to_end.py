"""Hybrid jobs through the whole service: `artsvc serve --local` (the API and its worker process) trains on RULER
rewards and stops by its rules on the environment's ground truth, reporting the judge's tokens and cost through the
API; the judge is a server on loopback, or a base model the service itself serves (no network at all)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service.api_client import ApiClient
from tests.judges.judge_server import judge_server

JUDGE = "openai/gpt-4o-mini"
SPEC = {
    "environment": "email",
    "model": {"base_model": "embedded/char-gpt-0.2m"},  # the smallest policy: this checks the plumbing, not learning
    "reward": {"mode": "hybrid", "judge_model": JUDGE},
    "training": {"warm_start_examples": 0, "max_steps": 2, "groups_per_step": 2, "group_size": 2},
    "validation": {"every_n_steps": 2, "max_examples": 2},
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _local_server(data_dir: Path, port: int, **settings: str) -> Iterator[httpx.Client]:
    """`artsvc serve --local` on ``port`` with these ARTSVC_ settings, and a client of it once it is healthy."""
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env.update(ARTSVC_DATA_DIR=str(data_dir), ARTSVC_JUDGE_BACKOFF_S="0.01",
               ARTSVC_WORKER_CPU_POLICY="nice", **settings)  # not SCHED_IDLE: the suite's other process keeps the cores busy
    cli = [sys.executable, "-m", "service"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
    try:
        ApiClient(base_url=base, token=None).wait_until_healthy()
        with httpx.Client(base_url=base, timeout=10) as client:
            yield client
    finally:
        server.terminate()
        server.wait(timeout=60)


def _run(client: httpx.Client, spec: dict) -> tuple[dict, dict]:
    """The job of ``spec`` once it ended, and its metrics."""
    job = client.post("/v1/jobs", json=spec).json()
    deadline = time.monotonic() + 500
    while (job := client.get(f"/v1/jobs/{job['id']}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(1)
    return job, client.get(f"/v1/jobs/{job['id']}/metrics").json()


@pytest.mark.timeout(600)
def test_a_hybrid_email_job_runs_through_the_api_to_a_stop_with_judge_cost_in_its_metrics(tmp_path):
    with judge_server() as judge:
        with _local_server(tmp_path / "data", _free_port(), ARTSVC_JUDGE_MODELS=JUDGE,
                           ARTSVC_JUDGE_API_BASE=judge.api_base, ARTSVC_JUDGE_API_KEY="test") as client:  # fmt: skip
            refused = client.post("/v1/jobs", json={**SPEC, "reward": {"mode": "hybrid", "judge_model": "openai/o3"}})
            assert refused.status_code == 422 and "'openai/o3' is not a judge this server allows" in refused.text
            job, metrics = _run(client, SPEC)
        judge_calls = len(judge.requests)
    assert job["status"] == "succeeded" and job["stop_reason"] == "max_steps", job
    assert [p["step"] for p in metrics["validation"]] == [0, 2]
    assert all(p["greedy_accuracy"] is not None for p in metrics["validation"])  # ground truth, not the judge
    totals = metrics["judge"]
    assert totals["judge_groups"] == 4 and totals["judge_responses"] == judge_calls == 4
    assert totals["judge_prompt_tokens"] > 0 and totals["judge_completion_tokens"] > 0 and totals["judge_cost_usd"] > 0
    assert all(s["metrics"]["judge_cost_usd"] > 0 for s in metrics["steps"])


@pytest.mark.timeout(600)
def test_a_hybrid_job_is_judged_offline_by_a_base_model_this_server_serves(tmp_path, tiny_lm):
    """The local judge: the operator serves a base model (the tiny LM) at the service's own /v1/chat/completions and
    points the judges there; RULER asks for the exact verdict schema, so even a random model's verdicts are used.
    No other server is involved: the worker's judge calls come back to the API that runs it."""
    port = _free_port()
    judge_model = "openai/local-judge"
    spec = {**SPEC, "environment": "math", "reward": {"mode": "hybrid", "judge_model": judge_model}}
    with _local_server(tmp_path / "data", port, ARTSVC_SERVED_BASE_MODELS=f"local-judge={tiny_lm}",
                       ARTSVC_JUDGE_MODELS=judge_model, ARTSVC_JUDGE_API_BASE=f"http://127.0.0.1:{port}/v1",
                       ARTSVC_JUDGE_API_KEY="local", ARTSVC_JUDGE_EXACT_VERDICTS="true") as client:  # fmt: skip
        job, metrics = _run(client, spec)
    assert job["status"] == "succeeded" and job["stop_reason"] == "max_steps", job
    totals = metrics["judge"]
    assert totals["judge_groups"] == 4 and totals["judge_dropped_groups"] == 0, totals
    assert totals["judge_responses"] == totals["judge_attempts"] == 4  # every verdict usable at the first call
    assert totals["judge_prompt_tokens"] > 0 and totals["judge_completion_tokens"] > 0
    assert all(p["greedy_accuracy"] is not None for p in metrics["validation"])  # ground truth, not the judge
