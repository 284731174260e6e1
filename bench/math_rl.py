"""Benchmark: the README's main job (``artsvc train --env math``), measured end to end.

Runs the job in a fresh data directory (so the warm start is really trained, not cached),
records wall time and peak memory of the process, reads the validation series back from the
store, and writes ``bench/results/math_rl.json`` plus the Markdown rows for README's Results.

    python bench/math_rl.py [--seed 0] [extra artsvc train flags...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
FORMAT_OUTCOMES = ("missing_prefix", "extra_whitespace", "not_single_line", "leading_zeros", "not_integer")


def machine() -> str:
    return f"{os.cpu_count()} CPU cores ({platform.machine()}), Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-bench-") as data_dir:
        env = {**os.environ, "ARTSVC_DATA_DIR": data_dir, "ARTSVC_DATABASE_URL": ""}
        env.pop("ARTSVC_DATABASE_URL")
        command = [sys.executable, "-m", "service", "train", "--env", "math", "--seed", str(args.seed), "--json", *extra]
        started = time.monotonic()
        completed = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        if completed.returncode != 0:
            sys.exit(f"training failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
        peak_rss_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
        summary = json.loads(completed.stdout.strip().splitlines()[-1])
        with sqlite3.connect(Path(data_dir) / "artsvc.db") as db:
            points = [
                {"step": s, "accuracy": a, "greedy_accuracy": g, "outcomes": json.loads(o)}
                for s, a, g, o in db.execute(
                    "select step, accuracy, greedy_accuracy, outcomes from validation_points where job_id = ? order by step",
                    (summary["id"],),
                )
            ]
    best = next(p for p in points if p["step"] == summary["best_step"])
    result = {
        "machine": machine(),
        "command": " ".join(command[2:]),
        "seed": args.seed,
        "wall_time_s": round(wall, 1),
        "peak_rss_gib": round(peak_rss_gib, 2),
        "summary": summary,
        "validation": points,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "math_rl.json").write_text(json.dumps(result, indent=2) + "\n")

    def formats(point):
        return sum(point["outcomes"].get(k, 0) for k in FORMAT_OUTCOMES)

    step0 = points[0]
    print("| step-0 val acc (greedy) | best val acc (greedy) | best step | steps | stop | format errors step 0 → best | wall time | peak RSS | machine |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {step0['accuracy']:.3f} ({step0['greedy_accuracy']:.3f}) | {best['accuracy']:.3f} ({best['greedy_accuracy']:.3f}) "
        f"| {summary['best_step']} | {summary['step']} | {summary['stop_reason']} | {formats(step0)} → {formats(best)} of {sum(step0['outcomes'].values())} "
        f"| {wall / 60:.1f} min | {peak_rss_gib:.2f} GiB | {machine()} |"
    )
    print()
    print("| step | val acc | greedy | correct | wrong_answer | format errors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for p in points:
        o = p["outcomes"]
        print(f"| {p['step']} | {p['accuracy']:.3f} | {p['greedy_accuracy']:.3f} | {o.get('correct', 0)} | {o.get('wrong_answer', 0)} | {formats(p)} |")


if __name__ == "__main__":
    main()
