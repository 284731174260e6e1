"""Benchmark: one tenant floods the API; does another tenant still get answers, and fast?

Starts ``artsvc serve --no-worker`` on a fresh SQLite store in a temporary folder (or ``--database-url``, an empty
database this script migrates), creates two client tokens, A and B, and one job for each. A separate load process
then floods from tenant A for ``--seconds``: ``--requests`` concurrent loops of ``GET /v1/jobs/{id}``,
``GET /v1/jobs`` and ``POST /v1/jobs`` (mixed 3:1:1), and ``--streams`` concurrent SSE streams of A's job events,
each reopened when it ends or is refused. Meanwhile this process is tenant B: it polls ``GET /v1/jobs/{id}`` and
``/healthz`` one after the other. Reports B's p50/p99 latency and status codes and A's status-code counts; writes
``bench/results/api_flood_<store>.json``. Load generator, probe and server share the machine's cores.

    python bench/api_flood.py [--seconds 20] [--requests 300] [--streams 200] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from http_load import percentile  # noqa: E402
from env_rl import machine  # noqa: E402
from service_overhead import free_port, wait_until_serving  # noqa: E402

QUEUED_SPEC = {"environment": "math", "training": {"max_steps": 1}}
TIMEOUT_S = 120  # far past any stall, so a stall shows as latency, not as a client-side timeout


def outcome(response: httpx.Response | None, error: Exception | None = None) -> str:
    return str(response.status_code) if response is not None else type(error).__name__


async def request_loop(http: httpx.AsyncClient, job_id: str, until: float, counts: Counter, index: int) -> None:
    """A's plain requests, back to back: three reads of its job, one list, one submission per five."""
    round_ = index
    while time.monotonic() < until:
        kind = ("get", "get", "list", "get", "post")[round_ % 5]
        round_ += 1
        try:
            if kind == "get":
                response = await http.get(f"/v1/jobs/{job_id}")
            elif kind == "list":
                response = await http.get("/v1/jobs")
            else:
                response = await http.post("/v1/jobs", json=QUEUED_SPEC)
            counts[f"{kind} {outcome(response)}"] += 1
            if response.status_code in (429, 503):  # honour Retry-After, roughly: a polite client backs off
                await asyncio.sleep(min(float(response.headers.get("retry-after", 1)), 1.0))
        except httpx.HTTPError as exc:
            counts[f"{kind} {outcome(None, exc)}"] += 1


async def stream_loop(http: httpx.AsyncClient, job_id: str, until: float, counts: Counter) -> None:
    """One of A's SSE streams: open, read until the flood ends, reopen if it closes or is refused."""
    headers = {"Accept": "text/event-stream"}
    while time.monotonic() < until:
        try:
            async with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
                counts[f"stream {outcome(response)}"] += 1
                if response.status_code != 200:
                    await response.aread()
                    await asyncio.sleep(min(float(response.headers.get("retry-after", 1)), 1.0))
                    continue
                async for _ in response.aiter_raw():
                    if time.monotonic() >= until:
                        break
        except httpx.HTTPError as exc:
            counts[f"stream {outcome(None, exc)}"] += 1
            await asyncio.sleep(0.2)


async def flood(base: str, token: str, job_id: str, seconds: float, requests: int, streams: int) -> dict[str, int]:
    counts: Counter = Counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx.Timeout(TIMEOUT_S, read=seconds + TIMEOUT_S)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=timeout) as http:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(request_loop(http, job_id, until, counts, index) for index in range(requests)),
            *(stream_loop(http, job_id, until, counts) for _ in range(streams)),
        )
    return dict(sorted(counts.items()))


def run_flood(base: str, token: str, job_id: str, seconds: float, requests: int, streams: int, results) -> None:  # noqa: ANN001
    """The load process's body: its own event loop and cores, apart from the probe's."""
    results.put(asyncio.run(flood(base, token, job_id, seconds, requests, streams)))


def probe(base: str, token: str, job_id: str, until: float) -> dict[str, list]:
    """Tenant B, one request at a time: its job, then /healthz, until the flood ends."""
    samples: dict[str, list] = {"GET /v1/jobs/{id}": [], "GET /healthz": []}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S) as http:
        while time.monotonic() < until:
            for name, path in (("GET /v1/jobs/{id}", f"/v1/jobs/{job_id}"), ("GET /healthz", "/healthz")):
                started = time.perf_counter()
                try:
                    status = outcome(http.get(path))
                except httpx.HTTPError as exc:
                    status = outcome(None, exc)
                samples[name].append((time.perf_counter() - started, status))
            time.sleep(0.2)
    return samples


def summary(samples: list[tuple[float, str]]) -> dict:
    latencies = [latency for latency, _ in samples]
    return {
        "count": len(samples),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        "max_ms": round(1000 * max(latencies), 1),
        "status_codes": dict(sorted(Counter(status for _, status in samples).items())),
    }


def cli(env: dict[str, str], *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "service", *args], env=env, check=True, capture_output=True, text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--requests", type=int, default=300, help="tenant A's concurrent request loops")
    parser.add_argument("--streams", type=int, default=200, help="tenant A's concurrent SSE streams")
    parser.add_argument("--database-url", help="an empty database to use instead of a fresh SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-flood-") as tmp:
        env = {**os.environ, "ARTSVC_DATA_DIR": tmp}
        env.pop("ARTSVC_DATABASE_URL", None)
        if args.database_url:
            env["ARTSVC_DATABASE_URL"] = args.database_url
        cli(env, "db", "upgrade")
        tokens = [cli(env, "token", "create", "--role", "client", "--name", name).strip().splitlines()[-1] for name in "AB"]
        port = free_port()
        log = open(Path(tmp) / "server.log", "w")  # noqa: SIM115 - read back after the server stops
        server = subprocess.Popen([sys.executable, "-m", "service", "serve", "--no-worker", "--port", str(port)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(base)
            jobs = [
                httpx.post(f"{base}/v1/jobs", json=QUEUED_SPEC, headers={"Authorization": f"Bearer {token}"}, timeout=60)
                .raise_for_status()
                .json()["id"]
                for token in tokens
            ]
            results: multiprocessing.Queue = multiprocessing.Queue()
            loader = multiprocessing.Process(
                target=run_flood, args=(base, tokens[0], jobs[0], args.seconds, args.requests, args.streams, results)
            )
            loader.start()
            started = time.monotonic()
            time.sleep(1)  # the flood builds up before B starts measuring
            b_samples = probe(base, tokens[1], jobs[1], until=time.monotonic() + args.seconds - 1)
            print(f"tenant B done after {time.monotonic() - started:.0f} s", file=sys.stderr)
            a_counts = results.get(timeout=args.seconds + 2 * TIMEOUT_S)
            print(f"tenant A done after {time.monotonic() - started:.0f} s", file=sys.stderr)
            loader.join()
        finally:
            server.terminate()  # uvicorn waits for open streams to end: stop it if they linger
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
        tracebacks = (Path(tmp) / "server.log").read_text().count("Traceback")
    result = {
        "store": "postgresql" if args.database_url else "sqlite",
        "seconds": args.seconds,
        "tenant_a": {"request_loops": args.requests, "streams": args.streams, "status_codes": a_counts},
        "tenant_b": {name: summary(samples) for name, samples in b_samples.items()},
        "server_tracebacks": tracebacks,
        "machine": machine(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"api_flood_{result['store']}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
