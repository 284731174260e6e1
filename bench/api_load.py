"""Benchmark: the API under load from a separate process, with no job training and while the default job trains.

Two runs of ``artsvc serve``, each on a fresh SQLite store, each loaded by
``bench/http_load.py`` in a process of its own: ``--connections`` keep-alive connections spread over
``--tokens`` operator tokens (the server caps requests in progress per credential: 16 by default), sending
``GET /v1/jobs/{id}``, every ``--post-every``-th request a ``POST /v1/jobs`` instead, at each of ``--rates``
in turn: requests a second offered on a fixed schedule (open loop: what a client sees at that load),
``closed`` for back to back (closed loop: how much the server can do; its latencies are queueing, by Little's
law connections / throughput), and ``closed-gets``, the closed loop with GETs only (the issue's own measurement:
50 keep-alive connections reading one job).

- idle: ``serve --no-worker``; the job waits in the queue.
- training: ``serve`` with its supervised worker training the default math job (SmolLM2, transformers
  backend; validation only at the end, so every step is alike). Step wall times are read from the store:
  ``--quiet-steps`` steps with no load, then, at each rate, the steps that ran wholly inside its load.

Writes ``bench/results/api_load.json`` (or ``--out``) and prints the README's table. Server, worker
and load share the machine's cores: that is the point (an operator's box), and the load process's own
cost per request is part of what the server competes with.

``--api-processes N`` serves with ``serve --api-processes N`` (N processes answering on one socket).

    python bench/api_load.py [--rates 100,200,300,closed,closed-gets] [--connections 50] [--seconds 20] [--load-steps 3]
                             [--api-processes 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from collections.abc import Callable
from typing import Any, NamedTuple

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine  # noqa: E402
from http_load import summary  # noqa: E402
from service_overhead import free_port, wait_until_serving  # noqa: E402

TRAINING_SPEC = {
    "environment": "math",
    "training": {"max_steps": 10_000},
    "validation": {"every_n_steps": 10_000, "patience": 1000},
}
QUEUED_SPEC = {"environment": "math", "training": {"max_steps": 1}}
GETS_ONLY = "closed-gets"


class Load(NamedTuple):
    """Requests a second offered (0: back to back), and every how many requests a POST (0: none)."""

    rate: float
    post_every: int

    @property
    def label(self) -> str:
        if self.rate:
            return f"{self.rate:g} req/s offered"
        return "closed loop" if self.post_every else "closed loop, GETs only"


class Server:
    """``artsvc serve`` on a free loopback port over the store in ``env``; stopped with SIGTERM on exit."""

    def __init__(self, env: dict[str, str], *extra: str) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "service", "serve", "--port", str(port), *extra]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> Server:
        wait_until_serving(self.base)
        return self

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=300)


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "service", *args], env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def generate_load(base: str, tokens: list[str], job_id: str, args: argparse.Namespace, load: Load) -> dict[str, Any]:
    command = [
        sys.executable, str(ROOT / "bench" / "http_load.py"), "--base", base, "--tokens", ",".join(tokens),
        "--get-path", f"/v1/jobs/{job_id}", "--post-path", "/v1/jobs", "--post-body", json.dumps(QUEUED_SPEC),
        "--post-every", str(load.post_every), "--connections", str(args.connections), "--seconds", str(args.seconds), "--rate", str(load.rate),
        "--with-samples",
    ]  # fmt: skip
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def steps(base: str, headers: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{base}/v1/jobs/{job_id}/metrics", headers=headers, timeout=60).raise_for_status().json()["steps"]


def wait_for_step(base: str, headers: dict[str, str], job_id: str, step: int) -> None:
    while True:
        job = httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=60).raise_for_status().json()
        if job["status"] not in ("queued", "running"):
            sys.exit(f"the training job ended early: {job['status']} {job.get('error')}")
        if job["step"] >= step:
            return
        time.sleep(1)


def idle_run(env: dict[str, str], tokens: list[str], args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {tokens[0]}"}
    with Server(env, "--no-worker", "--api-processes", str(args.api_processes)) as server:
        job = httpx.post(f"{server.base}/v1/jobs", json=TRAINING_SPEC, headers=headers, timeout=60).raise_for_status()
        return {load.label: merge([generate_load(server.base, tokens, job.json()["id"], args, load)]) for load in args.loads}


def training_run(env: dict[str, str], tokens: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Step times with no load, then each load (repeated in ``--seconds`` slices) until ``--load-steps`` steps ran
    wholly inside it; a load's latencies are those of all its slices together."""
    headers = {"Authorization": f"Bearer {tokens[0]}"}
    result: dict[str, Any] = {}
    with Server(env, "--api-processes", str(args.api_processes)) as server:
        job = (
            httpx.post(f"{server.base}/v1/jobs", json=TRAINING_SPEC, headers=headers, timeout=60)
            .raise_for_status()
            .json()
        )
        wait_for_step(server.base, headers, job["id"], 1)  # the model is loaded and a step has run
        wait_for_step(server.base, headers, job["id"], 1 + args.quiet_steps)
        quiet = steps(server.base, headers, job["id"])[1:]  # the first step also loads the model
        result["step_wall_s_no_load"] = {"steps": len(quiet), "median": median_wall(quiet)}
        for load in args.loads:
            load_started = datetime.now().astimezone()
            slices = []
            while True:
                slices.append(generate_load(server.base, tokens, job["id"], args, load))
                load_ended = datetime.now().astimezone()
                inside = [s for s in steps(server.base, headers, job["id"]) if wholly_inside(s, load_started, load_ended)]
                if len(inside) >= args.load_steps:
                    break
            result[load.label] = {**merge(slices), "step_wall_s": {"steps": len(inside), "median": median_wall(inside)}}
    return result


def median_wall(rows: list[dict[str, Any]]) -> float:
    return round(statistics.median(row["wall_time_s"] for row in rows), 2)


def wholly_inside(step: dict[str, Any], start: datetime, end: datetime) -> bool:
    """Whether a step began after ``start`` and was recorded before ``end`` (its row is written when it ends)."""
    ended = datetime.fromisoformat(step["created_at"])
    return ended - timedelta(seconds=step["wall_time_s"]) > start and ended <= end


def merge(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """Load slices as one run: counts add up, percentiles are over every request of every slice."""
    merged: dict[str, Any] = {
        "offered_per_s": slices[0]["offered_per_s"],
        "connections": slices[0]["connections"],
        "tokens": slices[0]["tokens"],
        "slices": len(slices),
        "seconds": round(sum(s["seconds"] for s in slices), 1),
        "requests": sum(s["requests"] for s in slices),
        "errors": sum(s["errors"] for s in slices),
        "errors_by_kind": {
            k: sum(s["errors_by_kind"].get(k, 0) for s in slices) for s in slices for k in s["errors_by_kind"]
        },
    }
    merged["requests_per_s"] = round(merged["requests"] / merged["seconds"], 1)
    names = [name for name in slices[0]["latencies_s"] if name in slices[0]["endpoints"]]  # those sent
    merged["endpoints"] = {name: summary([v for s in slices for v in s["latencies_s"][name]]) for name in names}
    merged["p99_ms_by_slice"] = {name: [s["endpoints"][name]["p99_ms"] for s in slices] for name in names}
    return merged


def in_fresh_store(run: Callable[..., dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """``run`` against a store of its own (a job queued by one run must not be the job another run trains)."""
    with tempfile.TemporaryDirectory(prefix="artsvc-load-") as tmp:
        env = {**os.environ, "ARTSVC_DATA_DIR": tmp}
        env.pop("ARTSVC_DATABASE_URL", None)
        cli(env, "db", "upgrade")
        tokens = [cli(env, "token", "create", "--role", "operator", "--name", f"load-{i}") for i in range(args.tokens)]
        return run(env, tokens, args)


def loads(text: str, post_every: int) -> list[Load]:
    """``--rates``: numbers (requests a second), ``closed`` and ``closed-gets``."""
    names = [part.strip() for part in text.split(",")]
    return [Load(0.0, 0) if name == GETS_ONLY else Load(0.0 if name == "closed" else float(name), post_every) for name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=5, help="operator tokens the connections are spread over")
    parser.add_argument("--rates", default="100,200,300,closed", help="comma-separated requests a second to offer, "
                        f"`closed` for back to back, `{GETS_ONLY}` back to back with no POSTs")
    parser.add_argument("--seconds", type=float, default=20, help="length of each idle load, and of each training slice")
    parser.add_argument("--post-every", type=int, default=10, help="every n-th request is a POST /v1/jobs")
    parser.add_argument("--quiet-steps", type=int, default=3, help="training steps timed with no load")
    parser.add_argument("--load-steps", type=int, default=3, help="training steps timed under load")
    parser.add_argument("--api-processes", type=int, default=1, help="`serve --api-processes`: processes answering")
    parser.add_argument("--out", type=Path, default=RESULTS / "api_load.json")
    args = parser.parse_args()
    args.loads = loads(args.rates, args.post_every)
    result = {"idle": in_fresh_store(idle_run, args), "training": in_fresh_store(training_run, args)}
    result["machine"] = machine()
    result["store"] = "sqlite"
    result["api_processes"] = args.api_processes
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| run | load | GET p50 / p99 | POST p50 / p99 | errors | throughput | step wall time (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run, runs in (("no job training", result["idle"]), ("a job training", result["training"])):
        for load in args.loads:
            stats = runs[load.label]
            get, post = (stats["endpoints"].get(name, {}) for name in ("GET /v1/jobs/{id}", "POST /v1/jobs"))
            step = stats.get("step_wall_s", {}).get("median", "–")
            print(f"| {run} | {load.label} | {ms(get)} | {ms(post)} "
                  f"| {stats['errors']} | {stats['requests_per_s']} req/s | {step} s |")  # fmt: skip
    print(f"step wall time with no load: {result['training']['step_wall_s_no_load']['median']} s (median)")


def ms(endpoint: dict[str, Any]) -> str:
    return f"{endpoint['p50_ms']} / {endpoint['p99_ms']} ms" if endpoint else "–"


if __name__ == "__main__":
    main()
