"""Benchmark: the service's overhead per training step against a plain ART script.

Runs the same math training (same seed, embedded backend, scenarios, sampling seeds and steps)
twice, one after the other on an idle machine: as ``bench/plain_art.py`` (gather, train, log)
and as a job submitted over HTTP to ``artsvc serve --local`` (its worker process records
steps, events, sampled rollouts and alerts in SQLite). Validation runs only at step 0 and the
last step in the service and not at all in the plain script, so neither is counted: the
compared number is the median wall time between consecutive step ends. The two runs must
produce the same reward at every step, or the comparison is void.

    python bench/service_overhead.py [--steps 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(base: str, *, attempts: int = 600) -> None:
    for _ in range(attempts):
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    sys.exit(f"the server at {base} did not come up")


def intervals(ends: list[float]) -> list[float]:
    """Step-to-step wall times, without the first step (it follows validation in the service)."""
    return [b - a for a, b in itertools.pairwise(ends)]


def run_plain(data_dir: Path, steps: int, seed: int) -> dict:
    command = [
        sys.executable,
        str(ROOT / "bench" / "plain_art.py"),
        "--data-dir",
        str(data_dir),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        sys.exit(f"plain ART script failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_service(data_dir: Path, steps: int, seed: int) -> dict:
    env = {**os.environ, "ARTSVC_DATA_DIR": str(data_dir), "ARTSVC_LOCAL_MODE": "true"}
    env.pop("ARTSVC_DATABASE_URL", None)
    subprocess.run([sys.executable, "-m", "service", "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--local", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base)
        spec = {"environment": "math", "seed": seed, "training": {"max_steps": steps},
                "validation": {"every_n_steps": steps, "patience": 1000}}  # fmt: skip
        job = httpx.post(f"{base}/v1/jobs", json=spec, timeout=10).raise_for_status().json()
        while job["status"] in ("queued", "running"):
            time.sleep(1)
            job = httpx.get(f"{base}/v1/jobs/{job['id']}", timeout=10).raise_for_status().json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    if job["status"] != "succeeded":
        sys.exit(f"service job ended {job['status']}: {job['error']}")
    with sqlite3.connect(data_dir / "artsvc.db") as db:
        rows = db.execute(
            "select created_at, reward_mean from training_steps where job_id = ? order by step", (job["id"],)
        ).fetchall()
    ends = [datetime.fromisoformat(created).timestamp() for created, _ in rows]
    return {"job": job, "step_ends_s": [e - ends[0] for e in ends], "reward_means": [r for _, r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-overhead-") as tmp:
        data_dir = Path(tmp)
        plain = run_plain(data_dir, args.steps, args.seed)  # also trains the warm start both runs then share
        service = run_service(data_dir, args.steps, args.seed)
    same = all(abs(a - b) < 1e-9 for a, b in zip(plain["reward_means"], service["reward_means"]))
    plain_step = statistics.median(intervals(plain["step_ends_s"]))
    service_step = statistics.median(intervals(service["step_ends_s"]))
    result = {
        "machine": machine(),
        "steps": args.steps,
        "seed": args.seed,
        "same_rewards_every_step": same,
        "plain_median_step_s": round(plain_step, 3),
        "service_median_step_s": round(service_step, 3),
        "ratio": round(service_step / plain_step, 3),
        "plain": plain,
        "service": {k: v for k, v in service.items() if k != "job"},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "service_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| steps | plain ART s/step (median) | service s/step (median) | ratio | same rewards every step | machine |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| {args.steps} | {plain_step:.3f} | {service_step:.3f} | {service_step / plain_step:.3f} | {same} | {machine()} |"
    )


if __name__ == "__main__":
    main()
