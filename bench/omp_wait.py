"""Benchmark: how torch's OpenMP threads should wait for each other, alone on the machine and beside a busy process.

A decode step of the main job is a string of small products (64 rows by 576 by 1536: about a millisecond each).
Between two of them the second thread waits; how it waits decides both how fast the product runs and what it costs
whatever else shares the cores (the API under ``artsvc serve``, another worker). libgomp offers three ways:

- ``passive``: ``OMP_WAIT_POLICY=PASSIVE``, a waiting thread sleeps at once (a futex) and is woken for the next
  region, which costs a wake-up per product;
- ``bounded``: ``GOMP_SPINCOUNT=10000`` and no wait policy, a waiting thread spins briefly (tens of microseconds)
  and then sleeps;
- ``active``: ``OMP_WAIT_POLICY=ACTIVE``, a waiting thread spins for as long as it takes (libgomp's 30 billion
  spins), burning a core while anything else wants it.

Each policy runs in a fresh process (libgomp reads its environment once, when torch loads), first alone and then
with one busy Python process beside it on the same cores, alternating policies round by round. Reported per policy:
the median over rounds of GFLOP/s and of the process's CPU use (percent of one core), and each policy's speed as a
ratio to ``passive`` measured in the same rounds.

    python bench/omp_wait.py [--rounds 5] [--products 3000] [--dtype float32|bfloat16]

Writes ``bench/results/omp_wait.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine  # noqa: E402

POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "bounded": {"GOMP_SPINCOUNT": "10000"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
}
SHAPE = (64, 576, 1536)  # one decode step's projection: 64 rows, SmolLM2-135M's hidden size to its MLP width

CHILD = """
import os, resource, sys, time, torch
m, k, n = {shape}
a, b = torch.randn(m, k, dtype=torch.{dtype}), torch.randn(k, n, dtype=torch.{dtype})
for _ in range(50):
    a @ b
start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
for _ in range({products}):
    a @ b
wall = time.perf_counter() - start
used = resource.getrusage(resource.RUSAGE_SELF)
busy = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
print(wall, busy, torch.get_num_threads())
"""


def spin_forever() -> None:
    while True:
        pass


def run_policy(policy: str, products: int, dtype: str) -> dict[str, float]:
    """One fresh process under ``policy``: the product loop's GFLOP/s and its CPU use (percent of one core)."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    script = CHILD.format(shape=SHAPE, products=products, dtype=dtype)
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    wall, busy, threads = (float(x) for x in out.split())
    m, k, n = SHAPE
    return {"gflops": 2 * m * k * n * products / wall / 1e9, "cpu_percent": 100 * busy / wall, "threads": threads}


def one_round(products: int, dtype: str, *, beside_busy: bool, order: list[str]) -> dict[str, dict[str, float]]:
    busy = multiprocessing.get_context("spawn").Process(target=spin_forever, daemon=True) if beside_busy else None
    if busy:
        busy.start()
        time.sleep(0.5)
    try:
        return {policy: run_policy(policy, products, dtype) for policy in order}
    finally:
        if busy:
            busy.terminate()
            busy.join()


def summarise(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    summary = {}
    for policy in POLICIES:
        summary[policy] = {
            "gflops_median": statistics.median(r[policy]["gflops"] for r in rounds),
            "cpu_percent_median": statistics.median(r[policy]["cpu_percent"] for r in rounds),
            "speed_vs_passive_median": statistics.median(r[policy]["gflops"] / r["passive"]["gflops"] for r in rounds),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "omp_wait.json")
    args = parser.parse_args()
    names = list(POLICIES)
    result: dict = {"machine": machine(), "shape": SHAPE, "dtype": args.dtype, "products": args.products,
                    "rounds": args.rounds}
    for setting, beside_busy in (("alone", False), ("beside_busy_process", True)):
        rounds = []
        for index in range(args.rounds):
            order = names if index % 2 == 0 else names[::-1]
            rounds.append(one_round(args.products, args.dtype, beside_busy=beside_busy, order=order))
            print(setting, index, json.dumps(rounds[-1]), flush=True)
        result[setting] = {"rounds": rounds, "summary": summarise(rounds)}
        print(setting, json.dumps(result[setting]["summary"], indent=1), flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
