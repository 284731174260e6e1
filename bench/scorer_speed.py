"""Throughput benchmark for the strict math scorer (environments/math/scorer.py).

Scores a realistic mix -- 70% correct ``Final: <int>`` completions, 30% varied
exploit / malformed strings -- on one core, and reports the median
scores/second over several repeats.  Writes bench/results/scorer_speed.json.

    python bench/scorer_speed.py --n 200000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from environments.math.scorer import SCORER_NAME, SCORER_VERSION, score  # noqa: E402

TARGET_PER_SECOND = 100_000

# Exploit templates: "{n}" is replaced by the expected answer.
EXPLOIT_TEMPLATES = [
    "Final:  {n}",
    "Final:\t{n}",
    "Final:\u00a0{n}",
    "Final:{n}",
    "final: {n}",
    "FINAL: {n}",
    "Final\uff1a {n}",
    "Answer: {n}",
    "**Final: {n}**",
    "The answer is Final: {n}",
    "Let me think step by step.\nFinal: {n}",
    "Final: {n}\nFinal: {n}",
    "Final: {n}\u2028{n}",
    "Final: {n} apples",
    "Final: {n}.0",
    "Final: +{n}",
    "Final: 0{n}",
    "Final: --{n}",
    "Final: \uff15",
    "Final: \u0665",
    "Final: 1,000",
    "Final: 5e1",
    "Final: 0x10",
    "Final: five",
    "Final: -0",
    "Final: \u200b{n}",
    "F\u0456nal: {n}",
    "",
    "Final: {wrong}",  # well-formed but wrong
    "Final: {wrong}",
]


def build_workload(n: int, seed: int) -> list[tuple[dict, str]]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        expected = rng.randint(-10_000, 1_000_000)
        example = {"expected_answer": expected, "question": "What is ...?"}
        if rng.random() < 0.70:
            completion = f"Final: {expected}"
            if rng.random() < 0.2:
                completion = "  " + completion + "\n"
        else:
            template = rng.choice(EXPLOIT_TEMPLATES)
            completion = template.format(n=abs(expected), wrong=expected + 1)
        items.append((example, completion))
    return items


def run_once(items: list[tuple[dict, str]]) -> float:
    scorer = score
    start = time.perf_counter()
    for example, completion in items:
        scorer(example, completion)
    elapsed = time.perf_counter() - start
    return len(items) / elapsed


def pin_to_one_core() -> str:
    if hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity"):
        try:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[0]})
            return f"pinned to cpu {cpus[0]}"
        except OSError as exc:
            return f"not pinned ({exc})"
    return "not pinned (no sched_setaffinity)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="scores per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "bench" / "results" / "scorer_speed.json",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        parser.error("--n and --repeats must be >= 1")

    pinning = pin_to_one_core()
    items = build_workload(args.n, args.seed)
    outcomes = Counter(score(ex, c)["details"]["outcome"] for ex, c in items)
    run_once(items[: min(len(items), 10_000)])  # warm-up

    rates = [run_once(items) for _ in range(args.repeats)]
    median = statistics.median(rates)

    machine = {
        "processor": platform.processor(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "pinning": pinning,
    }
    result = {
        "scorer_name": SCORER_NAME,
        "scorer_version": SCORER_VERSION,
        "n": args.n,
        "repeats": args.repeats,
        "seed": args.seed,
        "mix": {"correct_fraction_target": 0.70, "outcome_counts": dict(sorted(outcomes.items()))},
        "scores_per_second": {
            "median": median,
            "min": min(rates),
            "max": max(rates),
            "all": rates,
        },
        "target_per_second": TARGET_PER_SECOND,
        "meets_target": median >= TARGET_PER_SECOND,
        "machine": machine,
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"scorer: {SCORER_NAME} {SCORER_VERSION}")
    print(
        f"machine: processor={machine['processor']!r} cpu_count={machine['cpu_count']} "
        f"python={machine['python']} ({pinning})"
    )
    print(f"mix: {dict(sorted(outcomes.items()))}")
    print("repeats: " + ", ".join(f"{r:,.0f}/s" for r in rates))
    print(f"median: {median:,.0f} scores/second (target {TARGET_PER_SECOND:,}/s: "
          f"{'OK' if median >= TARGET_PER_SECOND else 'BELOW TARGET'})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
