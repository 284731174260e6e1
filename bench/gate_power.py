"""Benchmark: how large a lift the promotion gate can see on n validation examples (issue 32's "+8 with ACCEPT").

The gate (``service.evaluation.compare``) ACCEPTs a candidate when the 95% paired-bootstrap interval of its accuracy
delta over the baseline has a lower bound of at least ``min_delta`` (0.02). Each trial here draws a baseline and a
candidate of known true accuracies, one independent Bernoulli outcome per example (sampled validation at temperature
1 plays each example once), runs the gate's own interval on them, and counts how often it ACCEPTs: the gate's power
for that true lift. Paired examples that differ in difficulty (some 2048 seeds are easier) make outcomes correlate
and raise the power somewhat; independent outcomes are the conservative case.

    python bench/gate_power.py [--trials 200] [--examples 50 100 200 400]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.evaluation.compare import BOOTSTRAP_SEED, _paired  # noqa: E402

LIFTS = ((0.28, 0.36), (0.28, 0.43), (0.28, 0.48), (0.14, 0.22), (0.14, 0.34))  # (step 0, candidate) true accuracies
MIN_DELTA = 0.02
RESAMPLES = 2000  # the gate's


def power(examples: int, baseline: float, candidate: float, *, trials: int, rng: np.random.Generator) -> dict:
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, examples, size=(RESAMPLES, examples))
    lows = []
    for _ in range(trials):
        base = (rng.random(examples) < baseline).astype(float)
        cand = (rng.random(examples) < candidate).astype(float)
        lows.append(_paired(base, cand, picks, 0.95)["ci_low"])
    lows_array = np.array(lows)
    return {"examples": examples, "baseline": baseline, "candidate": candidate,
            "accept_rate": float((lows_array >= MIN_DELTA).mean()),
            "median_ci_low": float(np.median(lows_array))}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--examples", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = [power(n, b, c, trials=args.trials, rng=rng) for n in args.examples for b, c in LIFTS]
    for row in rows:
        print(f"{row['examples']:>4} examples, {row['baseline']:.2f} -> {row['candidate']:.2f}: "
              f"ACCEPT {row['accept_rate']:.2f}, median lower bound {row['median_ci_low']:+.3f}")  # fmt: skip
    out = Path(__file__).parent / "results" / "gate_power.json"
    out.write_text(json.dumps({"trials": args.trials, "min_delta": MIN_DELTA, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
