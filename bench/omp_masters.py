"""Benchmark: what a second thread that has run torch's parallel work costs the model thread (libgomp's thread pools).

``artsvc train`` computes on one thread (the model thread) while the event loop waits on the main thread. libgomp keeps
a pool of worker threads for every thread that has started an OpenMP parallel region, for as long as that thread
lives, and when it manages more threads than the process has CPUs it cuts every waiting thread's spin to a hundred
rounds (``gomp_throttled_spin_count_var``): a waiting worker then sleeps at once, as under ``OMP_WAIT_POLICY=PASSIVE``,
and each region pays a wake-up. On two cores, one parallel op run by the main thread (a tensor of a million elements
summed) is enough to give the process four managed threads for good.

The loop is the decode step's shape (64 rows by 576, times 576 by 1536, bf16 where the CPU runs it, else float32) on
a worker thread, as the model thread runs it. Each case runs in a fresh process, cases alternate round by round:

- ``alone``: nothing else ever started a parallel region;
- ``main_ran_parallel``: the main thread summed a million elements first.

    python bench/omp_masters.py [--rounds 5] [--products 3000]

Writes ``bench/results/omp_masters.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from env_rl import machine  # noqa: E402

from service.cpu import BRIEF_SPIN  # noqa: E402

CASES = ("alone", "main_ran_parallel")
ENV = {"GOMP_SPINCOUNT": BRIEF_SPIN}  # as ``artsvc train`` sets it (service/cpu.py)


def child(case: str, products: int) -> None:
    """In a fresh process: the loop on a worker thread, after the case's main-thread work; prints one JSON line."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    dtype = torch.bfloat16 if bf16 else torch.float32
    rows, weight = torch.randn(64, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    if case == "main_ran_parallel":
        torch.ones(1 << 20).sum()

    def loop() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(products):
            torch.nn.functional.linear(rows, weight)
        wall = time.perf_counter() - wall
        return wall, (time.process_time() - cpu) / wall

    with ThreadPoolExecutor(1) as thread:
        thread.submit(loop).result()  # untimed: the pool and oneDNN's kernels made
        wall, cpu = thread.submit(loop).result()
    print(json.dumps({"gflops": products * 2 * 64 * 576 * 1536 / wall / 1e9, "cpu_percent": 100 * cpu,
                      "dtype": str(dtype), "threads": torch.get_num_threads()}))  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "omp_masters.json")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for round_ in range(args.rounds):
        for case in CASES:
            out = subprocess.run([sys.executable, __file__, "--child", case, str(args.products)], check=True,
                                 capture_output=True, text=True, env={**os.environ, **ENV})  # fmt: skip
            runs[case].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {round_}: " + ", ".join(f"{c} {runs[c][-1]['gflops']:.0f} GFLOP/s" for c in CASES), flush=True)
    summary = {case: {"gflops_median": statistics.median(r["gflops"] for r in runs[case]),
                      "cpu_percent_median": statistics.median(r["cpu_percent"] for r in runs[case])}
               for case in CASES}  # fmt: skip
    ratios = [a["gflops"] / b["gflops"] for a, b in zip(runs["alone"], runs["main_ran_parallel"])]
    report = {"machine": machine(), "env": ENV, "products": args.products, "dtype": runs["alone"][0]["dtype"],
              "summary": summary, "alone_over_main_ran_parallel_median": statistics.median(ratios),
              "runs": runs}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for case, s in summary.items():
        print(f"{case:>18}: {s['gflops_median']:.0f} GFLOP/s at {s['cpu_percent_median']:.0f}% CPU")
    print(f"alone / main_ran_parallel: {report['alone_over_main_ran_parallel_median']:.2f}x (median of rounds)")


if __name__ == "__main__":
    main()
