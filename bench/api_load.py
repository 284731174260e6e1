"""Benchmark: API latency under load on loopback while a job trains.

Starts ``artsvc serve`` (API plus its worker process, SQLite) in a subprocess, creates a
client token, submits a math job that trains for the whole measurement, waits for its first
step, then runs 50 concurrent clients (this process, asyncio + httpx, one connection each),
each doing ``--requests`` rounds of ``GET /v1/jobs/{id}`` with one ``POST /v1/jobs`` every
fifth round. Reports p50/p99 latency per endpoint and the error count; writes
``bench/results/api_load.json``. The load generator shares the machine's cores with the
server and the training, so the numbers are an upper bound of what the server alone costs.

    python bench/api_load.py [--clients 50] [--requests 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine
from service_overhead import free_port, wait_until_serving

TRAINING_SPEC = {
    "environment": "math",
    "training": {"warm_start_examples": 0, "max_steps": 10_000},
    "validation": {"every_n_steps": 10_000, "patience": 1000},
}
QUEUED_SPEC = {"environment": "math", "training": {"max_steps": 1}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def client(
    base: str, token: str, job_id: str, rounds: int, latencies: dict[str, list[float]], errors: list[str]
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
        for i in range(rounds):
            for name, request in (("GET /v1/jobs/{id}", http.get(f"/v1/jobs/{job_id}")),) + (
                (("POST /v1/jobs", http.post("/v1/jobs", json=QUEUED_SPEC)),) if i % 5 == 0 else ()
            ):
                started = time.perf_counter()
                try:
                    response = await request
                    if response.status_code >= 400:
                        errors.append(f"{name}: {response.status_code}")
                except httpx.HTTPError as exc:
                    errors.append(f"{name}: {type(exc).__name__}")
                latencies[name].append(time.perf_counter() - started)


async def load(base: str, token: str, job_id: str, clients: int, rounds: int) -> dict:
    latencies: dict[str, list[float]] = {"GET /v1/jobs/{id}": [], "POST /v1/jobs": []}
    errors: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(*(client(base, token, job_id, rounds, latencies, errors) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    total = sum(map(len, latencies.values()))
    return {
        "clients": clients,
        "requests": total,
        "errors": len(errors),
        "error_examples": errors[:5],
        "wall_s": round(elapsed, 2),
        "requests_per_s": round(total / elapsed, 1),
        "endpoints": {
            name: {
                "count": len(values),
                "p50_ms": round(1000 * statistics.median(values), 1),
                "p99_ms": round(1000 * percentile(values, 0.99), 1),
            }
            for name, values in latencies.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=50, help="GET rounds per client")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-load-") as tmp:
        env = {**os.environ, "ARTSVC_DATA_DIR": tmp}
        env.pop("ARTSVC_DATABASE_URL", None)
        subprocess.run([sys.executable, "-m", "service", "db", "upgrade"], env=env, check=True, capture_output=True)
        created = subprocess.run(
            [sys.executable, "-m", "service", "token", "create", "--role", "client"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        token = created.stdout.strip().splitlines()[-1]
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(port)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"}
        try:
            wait_until_serving(base)
            job = (
                httpx.post(f"{base}/v1/jobs", json=TRAINING_SPEC, headers=headers, timeout=10).raise_for_status().json()
            )
            while job["step"] < 1:  # training, not just starting up
                time.sleep(0.5)
                job = httpx.get(f"{base}/v1/jobs/{job['id']}", headers=headers, timeout=10).raise_for_status().json()
            result = asyncio.run(load(base, token, job["id"], args.clients, args.requests))
            job = httpx.get(f"{base}/v1/jobs/{job['id']}", headers=headers, timeout=10).json()
            result["training_job_status_after"] = job["status"]
        finally:
            server.terminate()
            server.wait(timeout=60)
    result["machine"] = machine()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "api_load.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| endpoint | requests | p50 | p99 | errors | clients | throughput | machine |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, stats in result["endpoints"].items():
        print(f"| `{name}` | {stats['count']} | {stats['p50_ms']} ms | {stats['p99_ms']} ms | {result['errors']} "
              f"| {args.clients} | {result['requests_per_s']} req/s | {machine()} |")  # fmt: skip


if __name__ == "__main__":
    main()
