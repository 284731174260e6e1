"""Benchmark: how large a lift the promotion gate can see on n validation examples (issue 32's "+8 with ACCEPT").

The gate (``service.evaluation.compare``) ACCEPTs a candidate when the 95% paired-bootstrap interval of its accuracy
delta over the baseline has a lower bound of at least ``min_delta`` (0.02). Each trial here draws a baseline and a
candidate of known true accuracies, one Bernoulli outcome per example (sampled validation at temperature 1 plays each
example once), runs the gate's own interval on them, and counts how often it ACCEPTs: the gate's power for that true
lift.

The two sides of a pair are not independent in a real job: validation draws each example's tokens from a seed of its
own (``derive_seed(seed, "val", id)``), the same at every step, so two nearby policies share their random numbers
(common random numbers) and often play an example alike. ``--coupling`` models that: the share of examples whose two
outcomes are read off one shared uniform draw (``u < p`` and ``u < q``), the rest drawn independently; 0 is the
independent, conservative case. ``--from-results FILE ...`` measures it on finished jobs (bench/env_rl.py's results:
the step-0 and best-step outcomes of each example), as the observed correlation over the largest one two outcomes of
those accuracies can have, and runs the table at the median of the files.

    python bench/gate_power.py [--trials 1000] [--examples 50 100 200 400] [--coupling 0.0]
    python bench/gate_power.py --from-results bench/results/twenty48_rl_zen4_*.json --label 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.evaluation.compare import BOOTSTRAP_SEED, _paired  # noqa: E402

LIFTS = ((0.28, 0.36), (0.28, 0.43), (0.28, 0.48), (0.14, 0.22), (0.14, 0.34), (0.22, 0.31))  # true accuracies
MIN_DELTA = 0.02
RESAMPLES = 2000  # the gate's


def draw(examples: int, baseline: float, candidate: float, coupling: float, rng: np.random.Generator) -> tuple:
    """One trial's outcomes: a share ``coupling`` of the examples read both sides off one uniform draw."""
    shared, own = rng.random(examples), rng.random(examples)
    coupled = rng.random(examples) < coupling
    return (shared < baseline).astype(float), (np.where(coupled, shared, own) < candidate).astype(float)


def power(examples: int, baseline: float, candidate: float, *, coupling: float, trials: int,
          rng: np.random.Generator) -> dict:  # fmt: skip
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, examples, size=(RESAMPLES, examples))
    lows = np.array([_paired(*draw(examples, baseline, candidate, coupling, rng), picks, 0.95)["ci_low"]
                     for _ in range(trials)])  # fmt: skip
    return {"examples": examples, "baseline": baseline, "candidate": candidate, "coupling": coupling,
            "accept_rate": float((lows >= MIN_DELTA).mean()), "median_ci_low": float(np.median(lows))}  # fmt: skip


def coupling_of(result: dict) -> dict | None:
    """A finished job's coupling between its step-0 and best-step outcomes per example (None where it has no best
    step past 0, or either side is all one outcome): the observed correlation over the largest possible."""
    best = result["summary"].get("best_step")
    sides = [{e["scenario_id"]: float(e["correct"]) for e in result["examples"] if e["step"] == s} for s in (0, best)]
    ids = sorted(set(sides[0]) & set(sides[1]))
    if not best or not ids:
        return None
    x, y = (np.array([side[i] for i in ids]) for side in sides)
    p, q = x.mean(), y.mean()
    spread = p * (1 - p) * q * (1 - q)
    if spread == 0:
        return None
    correlation = float(np.corrcoef(x, y)[0, 1])
    largest = float((min(p, q) - p * q) / np.sqrt(spread))
    return {"examples": len(ids), "step0": float(p), "best": float(q), "best_step": best,
            "correlation": round(correlation, 3), "coupling": round(max(0.0, correlation / largest), 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--examples", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument("--coupling", type=float, default=0.0, help="share of examples drawn from one uniform (0-1)")
    parser.add_argument("--from-results", type=Path, nargs="+", help="measure the coupling on these jobs' results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="", help="appended to the results file's name, e.g. 2048")
    args = parser.parse_args()
    if not 0.0 <= args.coupling <= 1.0:
        parser.error("--coupling must be in [0, 1]")
    measured = {}
    if args.from_results:
        measured = {str(path): coupling_of(json.loads(path.read_text())) for path in args.from_results}
        for path, found in measured.items():
            print(f"{path}: {json.dumps(found)}")
        found = [m["coupling"] for m in measured.values() if m is not None]
        if not found:
            parser.error("none of these results has a best step past 0 with both outcomes at both steps")
        args.coupling = statistics.median(found)
        print(f"median coupling over {len(found)} jobs: {args.coupling:.3f}")
    rows = [power(n, b, c, coupling=args.coupling, trials=args.trials, rng=np.random.default_rng([args.seed, n, i]))
            for n in args.examples for i, (b, c) in enumerate(LIFTS)]  # a row's draws do not depend on the others
    for row in rows:
        print(f"{row['examples']:>4} examples, {row['baseline']:.2f} -> {row['candidate']:.2f}: "
              f"ACCEPT {row['accept_rate']:.2f}, median lower bound {row['median_ci_low']:+.3f}")  # fmt: skip
    out = Path(__file__).parent / "results" / f"gate_power{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"trials": args.trials, "min_delta": MIN_DELTA, "coupling": args.coupling,
                               "measured": measured, "rows": rows}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
