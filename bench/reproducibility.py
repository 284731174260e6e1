"""Benchmark: how reproducible the README's main job is, run after run, across thread counts and seeds.

Runs ``artsvc train --env math`` (the README's main command, each time in a fresh data directory) once per
``--run SEED:THREADS`` (THREADS: torch's intra-op threads through ``OMP_NUM_THREADS``; ``default`` leaves
torch's own choice, one per physical core), and records each run's validation series, its per-step mean
training reward and loss, and two digests: runs of one seed with equal ``outcomes`` sampled and scored the same
at every step; with equal ``bits`` their losses also agree to the last bit. Writes ``bench/results/reproducibility.json`` after every run (a long session keeps what finished).

    python bench/reproducibility.py --run 0:default --run 0:default --run 0:1 --run 1:default --run 2:default
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_rl import RESULTS, machine, train_and_read  # noqa: E402


def digests(run: dict[str, Any]) -> dict[str, str]:
    """Two fingerprints of a run. ``outcomes``: every validation accuracy and every step's mean reward (what was
    sampled and how it scored). ``bits``: those and every step's loss, a float that moves with any rounding."""
    outcomes = [(p["step"], p["accuracy"], p["greedy_accuracy"]) for p in run["validation"]]
    outcomes += [(s["step"], s["reward_mean"]) for s in run["steps"]]
    bits = outcomes + [(s["step"], s["loss"]) for s in run["steps"]]
    return {name: hashlib.sha256(json.dumps(series).encode()).hexdigest()[:16] for name, series in
            (("outcomes", outcomes), ("bits", bits))}  # fmt: skip


def one_run(seed: int, threads: str) -> dict[str, Any]:
    saved = os.environ.get("OMP_NUM_THREADS")
    if threads != "default":
        os.environ["OMP_NUM_THREADS"] = threads
    try:
        result = train_and_read("math", seed, [])
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
        if saved is not None:
            os.environ["OMP_NUM_THREADS"] = saved
    return {
        "seed": seed,
        "threads": threads,
        "runtime": result["manifest"].get("runtime"),
        "wall_time_s": result["wall_time_s"],
        "digests": digests(result),
        "validation": [{k: p[k] for k in ("step", "accuracy", "greedy_accuracy")} for p in result["validation"]],
        "steps": result["steps"],
        "best_step": result["summary"]["best_step"],
        "stop_reason": result["summary"]["stop_reason"],
    }


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Final and best validation accuracy over runs: min, max, and the population standard deviation."""

    def stats(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "max": max(values), "stdev": round(statistics.pstdev(values), 4)}

    finals = [r["validation"][-1]["accuracy"] for r in runs]
    bests = [max(p["accuracy"] for p in r["validation"]) for r in runs]
    return {"runs": len(runs), "final_accuracy": stats(finals), "best_accuracy": stats(bests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="SEED:THREADS, e.g. 0:default or 0:1")
    parser.add_argument("--out", type=Path, default=RESULTS / "reproducibility.json")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    for spec in args.run:
        seed, _, threads = spec.partition(":")
        runs.append(one_run(int(seed), threads or "default"))
        by_seed: dict[str, list[dict[str, str]]] = {}
        for r in runs:
            by_seed.setdefault(f"seed {r['seed']}", []).append(r["digests"])
        result = {
            "machine": machine(),
            "runs": runs,
            "same_bits_per_seed": {k: len({d["bits"] for d in v}) == 1 for k, v in by_seed.items()},
            "same_outcomes_per_seed": {k: len({d["outcomes"] for d in v}) == 1 for k, v in by_seed.items()},
            "spread_over_all_runs": spread(runs),
        }
        args.out.parent.mkdir(exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        last = runs[-1]
        print(f"seed {last['seed']} threads {last['threads']}: digests {last['digests']}, "
              f"val {[p['accuracy'] for p in last['validation']]}, {last['wall_time_s'] / 60:.1f} min", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
