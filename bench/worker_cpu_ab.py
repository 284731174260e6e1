"""Benchmark: the API under closed-loop load while a job trains, its worker's CPU policy switched back and forth live.

How a supervised worker yields the CPU to the API (``ARTSVC_WORKER_CPU_POLICY``, service/cpu.py) is judged on one
job: restarting serve for each policy would compare different phases of training (and reload the model), and the
same closed loop varies by 1.5x from one minute to the next on these machines. So one ``artsvc serve`` trains the
default math job (as ``bench/api_load.py`` does), and once its model is loaded each round loads the API for
``--seconds`` with its worker's threads in SCHED_IDLE and for as long again under the normal policy at niceness
``ARTSVC_WORKER_NICE`` (the order alternating from round to round), with ``bench/http_load.py`` as the load: 50
connections back to back, every tenth request a ``POST /v1/jobs``. Reported: per policy, the median over rounds of
throughput and of each endpoint's p50 and p99, and idle / nice.

Linux only (SCHED_IDLE), by the user who runs serve.

    python bench/worker_cpu_ab.py [--rounds 7] [--seconds 15]

Writes ``bench/results/worker_cpu_ab.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from api_load import TRAINING_SPEC, Load, Server, generate_load, in_fresh_store, wait_for_step  # noqa: E402
from env_rl import machine  # noqa: E402

POLICIES = {"idle": os.SCHED_IDLE, "nice": os.SCHED_OTHER}


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux: the parent field of each /proc/<pid>/stat)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]  # after "pid (command name)"
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        if int(parent) == pid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def set_policy(pid: int, policy: str) -> None:
    """Every thread of process ``pid`` under ``policy`` (the normal policy keeps the niceness it started with)."""
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setscheduler(int(thread.name), POLICIES[policy], os.sched_param(0))
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def alternate(env: dict[str, str], tokens: list[str], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    headers = {"Authorization": f"Bearer {tokens[0]}"}
    runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in POLICIES}
    with Server({**env, "ARTSVC_WORKER_CPU_POLICY": "nice"}) as server:
        job = httpx.post(f"{server.base}/v1/jobs", json=TRAINING_SPEC, headers=headers, timeout=60).raise_for_status()
        wait_for_step(server.base, headers, job.json()["id"], 1)  # the model is loaded and a step has run
        (worker,) = children(server.process.pid)
        for round_ in range(args.rounds):
            for policy in POLICIES if round_ % 2 == 0 else reversed(POLICIES):
                set_policy(worker, policy)
                load = generate_load(server.base, tokens, job.json()["id"], args, Load(0.0, args.post_every))
                runs[policy].append({
                    "requests_per_s": load["requests_per_s"], "errors": load["errors"],
                    **{f"{name.split()[0]} {q}": stats[q] for name, stats in load["endpoints"].items() for q in ("p50_ms", "p99_ms")},
                })  # fmt: skip
                print(f"round {round_ + 1} {policy}: {json.dumps(runs[policy][-1])}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=15, help="length of each load")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "worker_cpu_ab.json")
    args = parser.parse_args()
    args.connections, args.post_every, args.tokens = 50, 10, 5  # as bench/api_load.py's defaults
    runs = in_fresh_store(alternate, args)
    medians = {name: {key: statistics.median(run[key] for run in rows) for key in rows[0]} for name, rows in runs.items()}
    ratio = {key: round(medians["idle"][key] / medians["nice"][key], 2) for key in medians["nice"] if medians["nice"][key]}
    result = {"seconds": args.seconds, "rounds": args.rounds, "runs": runs, "medians": medians, "idle_over_nice": ratio,
              "machine": machine()}  # fmt: skip
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"medians": medians, "idle_over_nice": ratio}, indent=2))


if __name__ == "__main__":
    main()
