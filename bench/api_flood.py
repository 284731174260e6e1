"""Benchmark: one tenant floods the API; does another tenant still get answers, and fast?

Starts ``artsvc serve --no-worker`` on a fresh SQLite store in a temporary folder (or ``--database-url``, an empty
database this script migrates), with two client tokens, A and B, and one job each. A separate load process then
floods from tenant A for ``--seconds`` (bench/floods.py says what each ``--scenario`` sends):

- ``requests``: reads, lists and submissions, and SSE streams;
- ``slow-body``: ``--sockets`` connections sending a head with ``Content-Length: 60000`` and one byte, half of them
  with A's token and half with made-up tokens in four spellings of the scheme;
- ``inference``: ``--chats`` loops of large ``POST /v1/chat/completions`` on A's own job. Both jobs then have a
  checkpoint: a LoRA adapter (random weights) of ``--base-model``, SmolLM2-135M-Instruct (converted from its GGUF
  file once, into the data folder) or ``tiny`` (the tests' 2-layer Llama with SmolLM2's tokenizer).

Meanwhile this process is tenant B, one request at a time: ``GET /v1/jobs/{id}``, ``GET /v1/jobs`` and ``/healthz``,
and for ``inference`` a one-token chat on its own job. Reports B's p50/p99 latency and status codes, A's
status-code counts, whether any 5xx but 503 was seen, and the server's tracebacks; writes
``bench/results/api_flood_<store>.json`` (``api_flood_<scenario>_<store>.json`` for the other scenarios).
Load generator, probe and server share the machine's cores.

    python bench/api_flood.py [--scenario requests|slow-body|inference] [--seconds 20] [--database-url URL] ...
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
from env_rl import machine  # noqa: E402
from floods import FLOODS, QUEUED_SPEC, TIMEOUT_S, FloodSize, outcome  # noqa: E402
from http_load import percentile  # noqa: E402
from service_overhead import free_port, wait_until_serving  # noqa: E402

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
TINY_CHAT = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 1}


def run_flood(scenario: str, base: str, token: str, job_id: str, seconds: float, size: FloodSize, results) -> None:  # noqa: ANN001
    """The load process's body: its own event loop and cores, apart from the probe's."""
    counts = asyncio.run(FLOODS[scenario](base, token, job_id, time.monotonic() + seconds, size))
    results.put(dict(sorted(counts.items())))


def probe(base: str, token: str, job_id: str, until: float, *, chat: bool) -> dict[str, list]:
    """Tenant B until the flood ends: its reads one at a time, and (``chat``) its one-token chats one at a time in a
    thread of their own, so a slow chat does not thin out the reads' samples."""
    reads = [("GET /v1/jobs/{id}", "GET", f"/v1/jobs/{job_id}", None), ("GET /v1/jobs", "GET", "/v1/jobs", None),
             ("GET /healthz", "GET", "/healthz", None)]  # fmt: skip
    chats = [("POST /v1/chat/completions (1 token)", "POST", "/v1/chat/completions", {**TINY_CHAT, "model": job_id})]
    with ThreadPoolExecutor() as threads:
        done = threads.map(lambda probes: sample(base, token, probes, until), [reads, chats] if chat else [reads])
        return {name: samples for found in done for name, samples in found.items()}


def sample(base: str, token: str, probes: list[tuple], until: float) -> dict[str, list]:
    """``probes`` (name, method, path, JSON body) one after the other, timed, until ``until``."""
    samples: dict[str, list] = {name: [] for name, *_ in probes}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT_S) as http:
        while time.monotonic() < until:
            for name, method, path, body in probes:
                started = time.perf_counter()
                try:
                    status = outcome(http.request(method, path, json=body))
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


def other_5xx(*status_counts: dict[str, int]) -> list[str]:
    """Statuses seen that are 5xx but 503 (the one a busy server may answer), e.g. ``chat 500``."""
    return sorted({key for counts in status_counts for key in counts if key.rsplit(" ", 1)[-1][:1] == "5"
                   and not key.endswith("503")})  # fmt: skip


def tokens_and_jobs(env: dict[str, str], data_dir: Path, *, checkpoints: str | None) -> tuple[list[str], list[str]]:
    """Client tokens A and B and a job of each: queued, or with a servable checkpoint of base model ``checkpoints``."""
    from sqlmodel import Session

    from service.auth import create_token
    from service.settings import Settings
    from service.spec import JobSpec
    from service.store import runs
    from service.store.db import make_engine
    from service.store.tables import Role
    from tests.service import adapter_checkpoints as ckpt

    settings = Settings(_env_file=None, data_dir=data_dir, database_url=env.get("ARTSVC_DATABASE_URL"))
    engine = make_engine(settings.resolved_database_url)
    with Session(engine, expire_on_commit=False) as session:
        made = [create_token(session, role=Role.client, name=name) for name in "AB"]
        queued = [runs.create_job(session, spec=JobSpec.model_validate(QUEUED_SPEC), owner_id=row.id) for row, _ in made]
        session.commit()
    jobs = [job.id for job in queued]
    if checkpoints is not None:
        adapter = checkpoint_adapter(checkpoints, data_dir)
        jobs = [ckpt.new_job(engine, owner_id=row.id) for row, _ in made]
        for job_id in jobs:
            ckpt.place(adapter, settings, job_id, 1)
    engine.dispose()
    return [secret for _, secret in made], jobs


def checkpoint_adapter(base_model: str, data_dir: Path):  # noqa: ANN201
    """A random LoRA adapter of ``base_model`` (``tiny`` or SmolLM2-135M-Instruct), saved in ``data_dir``."""
    from tests.service import adapter_checkpoints as ckpt

    if base_model == "tiny":
        from tests.tiny_lm import build_tiny_lm

        base = build_tiny_lm(data_dir / "tiny-lm")
    else:
        from service.backends.transformers.models import DEFAULT_BASE_MODEL, resolve_base_model

        base = resolve_base_model(DEFAULT_BASE_MODEL, data_dir / "cache" / "base-models")
    return ckpt.make_adapter(base, data_dir / "adapter")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(FLOODS), default="requests")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--database-url", help="an empty database to use instead of a fresh SQLite file")
    parser.add_argument("--base-model", choices=["smollm2", "tiny"], default="smollm2", help="inference: the checkpoints' base")
    for field in fields(FloodSize):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    args = parser.parse_args()
    size = FloodSize(**{field.name: getattr(args, field.name) for field in fields(FloodSize)})
    chat = args.scenario == "inference"
    with tempfile.TemporaryDirectory(prefix="artsvc-flood-") as tmp:
        env = {**os.environ, "ARTSVC_DATA_DIR": tmp, "TQDM_DISABLE": "1"}
        env.pop("ARTSVC_DATABASE_URL", None)
        if args.database_url:
            env["ARTSVC_DATABASE_URL"] = args.database_url
        subprocess.run([sys.executable, "-m", "service", "db", "upgrade"], env=env, check=True, capture_output=True)
        tokens, jobs = tokens_and_jobs(env, Path(tmp), checkpoints=args.base_model if chat else None)
        port = free_port()
        log = open(Path(tmp) / "server.log", "w")  # noqa: SIM115 - read back after the server stops
        server = subprocess.Popen([sys.executable, "-m", "service", "serve", "--no-worker", "--port", str(port)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(base)
            if chat:  # both checkpoints loaded before the clock starts: the flood measures serving, not loading
                for token, job_id in zip(tokens, jobs):
                    httpx.post(f"{base}/v1/chat/completions", json={**TINY_CHAT, "model": job_id},
                               headers={"Authorization": f"Bearer {token}"}, timeout=600).raise_for_status()  # fmt: skip
            results: multiprocessing.Queue = multiprocessing.Queue()
            loader = multiprocessing.Process(
                target=run_flood, args=(args.scenario, base, tokens[0], jobs[0], args.seconds, size, results)
            )
            loader.start()
            started = time.monotonic()
            time.sleep(1)  # the flood builds up before B starts measuring
            b_samples = probe(base, tokens[1], jobs[1], until=time.monotonic() + args.seconds - 1, chat=chat)
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
    tenant_b = {name: summary(samples) for name, samples in b_samples.items()}
    sizes = {
        "requests": {"request_loops": size.requests, "streams": size.streams},
        "slow-body": {"sockets": size.sockets},
        "inference": {"chat_loops": size.chats, "prompt_words": size.prompt_words, "n": size.n,
                      "max_tokens": size.max_tokens, "base_model": args.base_model},
    }[args.scenario]  # fmt: skip
    result = {
        "scenario": args.scenario,
        "store": "postgresql" if args.database_url else "sqlite",
        "seconds": args.seconds,
        "tenant_a": {**sizes, "status_codes": a_counts},
        "tenant_b": tenant_b,
        "other_5xx": other_5xx(a_counts, *({f"{name} {code}": n for code, n in s["status_codes"].items()}
                                           for name, s in tenant_b.items())),  # fmt: skip
        "server_tracebacks": tracebacks,
        "machine": machine(),
    }
    RESULTS.mkdir(exist_ok=True)
    name = "api_flood" if args.scenario == "requests" else f"api_flood_{args.scenario.replace('-', '_')}"
    (RESULTS / f"{name}_{result['store']}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
