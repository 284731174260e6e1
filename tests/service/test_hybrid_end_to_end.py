"""A hybrid job through the whole service: `artsvc serve --local` (the API and its worker process) trains the
email agent on RULER rewards from a judge server on loopback, stops by its rules on the environment's
ground truth, and reports the judge's tokens and cost through the API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

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


@pytest.mark.timeout(600)
def test_a_hybrid_email_job_runs_through_the_api_to_a_stop_with_judge_cost_in_its_metrics(tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with judge_server() as judge:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
        env.update(ARTSVC_DATA_DIR=str(tmp_path / "data"), ARTSVC_JUDGE_MODELS=JUDGE, ARTSVC_JUDGE_API_BASE=judge.api_base,
                   ARTSVC_JUDGE_API_KEY="test", ARTSVC_JUDGE_BACKOFF_S="0.01")  # fmt: skip
        cli = [sys.executable, "-m", "service"]
        subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
        server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
        try:
            with httpx.Client(base_url=base, timeout=10) as client:
                for _ in range(600):
                    try:
                        if client.get("/healthz").json()["status"] == "ok":
                            break
                    except httpx.TransportError:
                        time.sleep(0.2)
                refused = client.post(
                    "/v1/jobs", json={**SPEC, "reward": {"mode": "hybrid", "judge_model": "openai/o3"}}
                )
                assert refused.status_code == 422 and "'openai/o3' is not a judge this server allows" in refused.text
                job = client.post("/v1/jobs", json=SPEC).json()
                deadline = time.monotonic() + 500
                while (job := client.get(f"/v1/jobs/{job['id']}").json())["status"] in ("queued", "running"):
                    assert time.monotonic() < deadline, job
                    time.sleep(1)
                metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()
            judge_calls = len(judge.requests)
        finally:
            server.terminate()
            server.wait(timeout=60)
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
    base = f"http://127.0.0.1:{port}"
    judge_model = "openai/local-judge"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env.update(ARTSVC_DATA_DIR=str(tmp_path / "data"), ARTSVC_SERVED_BASE_MODELS=f"local-judge={tiny_lm}",
               ARTSVC_JUDGE_MODELS=judge_model, ARTSVC_JUDGE_API_BASE=f"{base}/v1", ARTSVC_JUDGE_API_KEY="local",
               ARTSVC_JUDGE_EXACT_VERDICTS="true", ARTSVC_JUDGE_BACKOFF_S="0.01",
               ARTSVC_WORKER_CPU_POLICY="nice")  # fmt: skip
    spec = {**SPEC, "environment": "math", "reward": {"mode": "hybrid", "judge_model": judge_model}}
    cli = [sys.executable, "-m", "service"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(600):
                try:
                    if client.get("/healthz").json()["status"] == "ok":
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            job = client.post("/v1/jobs", json=spec).json()
            deadline = time.monotonic() + 500
            while (job := client.get(f"/v1/jobs/{job['id']}").json())["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, job
                time.sleep(1)
            metrics = client.get(f"/v1/jobs/{job['id']}/metrics").json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert job["status"] == "succeeded" and job["stop_reason"] == "max_steps", job
    totals = metrics["judge"]
    assert totals["judge_groups"] == 4 and totals["judge_dropped_groups"] == 0, totals
    assert totals["judge_responses"] == totals["judge_attempts"] == 4  # every verdict usable at the first call
    assert totals["judge_prompt_tokens"] > 0 and totals["judge_completion_tokens"] > 0
    assert all(p["greedy_accuracy"] is not None for p in metrics["validation"])  # ground truth, not the judge
