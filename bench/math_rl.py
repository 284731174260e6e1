"""Benchmark: the README's main job (``artsvc train --env math``), measured end to end.

Runs the job in a fresh data directory (so nothing is cached: the base model is converted, a warm start trained),
records wall time and peak memory of the process, reads the validation series back from the store, puts the
best step against step 0 through the promotion gate (``service.evaluation.compare``, min_delta 0.02), and writes
``bench/results/math_rl.json`` plus the Markdown rows for README's Results.

    python bench/math_rl.py [--seed 0] [extra artsvc train flags...]
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from env_rl import RESULTS, machine, train_and_read

from service.evaluation.compare import Measured, compare

FORMAT_OUTCOMES = ("missing_prefix", "extra_whitespace", "not_single_line", "leading_zeros", "not_integer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args, extra = parser.parse_known_args()
    result = train_and_read("math", args.seed, extra)
    summary, points, wall, peak_rss_gib = result["summary"], result["validation"], result["wall_time_s"], result["peak_rss_gib"]
    best = next(p for p in points if p["step"] == summary["best_step"])

    def measured(step: int) -> Measured:
        rows = [SimpleNamespace(**e) for e in result["examples"] if e["step"] == step]
        return Measured(id=summary["id"], kind="training", step=step, manifest=result["manifest"], results=rows)

    gate = compare(measured(0), measured(summary["best_step"]), min_delta=0.02)
    result["gate"] = {k: gate[k] for k in ("decision", "reasons", "overall", "outcomes")}
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
    overall = gate["overall"] or {}
    print(f"\ngate, step {summary['best_step']} against step 0 (min_delta 0.02): {gate['decision']}"
          f" (delta {overall.get('delta', float('nan')):+.3f}, 95% interval [{overall.get('ci_low', float('nan')):+.3f},"
          f" {overall.get('ci_high', float('nan')):+.3f}]){'; ' + '; '.join(gate['reasons']) if gate['reasons'] else ''}")


if __name__ == "__main__":
    main()
