"""The promotion gate: is a candidate run better than a baseline run, and may the two even be compared?

Two measurements are comparable only when their manifests agree on every locked field (the Locked Room
rule) and they scored the same scenarios. Then the accuracy delta gets a paired bootstrap confidence
interval over examples, overall and for the rate of every outcome code, so a rise in one failure mode
shows even when the total improves. The gate ACCEPTs only when the interval's lower bound clears
``min_delta`` and no failure outcome became more frequent beyond its interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import manifests

BOOTSTRAP_SEED = 0  # fixed: the same two runs always get the same interval


@dataclass(frozen=True)
class Measured:
    """One side of a comparison: a job or evaluation at one step, with its per-example results."""

    id: str
    kind: str
    step: int
    manifest: dict[str, Any] | None
    results: Sequence[Any]  # ExampleResult rows: scenario_id, outcome, correct


def _interval(deltas: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    return float(low), float(high)


def _paired(base: np.ndarray, cand: np.ndarray, picks: np.ndarray, confidence: float) -> dict[str, float | int]:
    """Each side's rate, the delta with its bootstrap interval, and the examples that moved: counted on one side only
    (the discordant pairs, which alone carry the delta: examples alike on both sides cancel).

    A delta is a difference of counts over the examples, divided once: k examples more is k/n to the last bit, where
    a difference of two means rounds. So a bound of exactly ``min_delta`` is not read as under it (it was: 12 games
    more of 100, with the interval [+0.02, +0.22], came out as [+0.0199999..., ...] and REJECT at min_delta 0.02)."""
    n = len(base)
    deltas = (cand[picks].sum(axis=1) - base[picks].sum(axis=1)) / n
    low, high = _interval(deltas, confidence)
    return {"baseline": float(base.mean()), "candidate": float(cand.mean()), "delta": float((cand.sum() - base.sum()) / n),
            "ci_low": low, "ci_high": high, "candidate_only": int(((cand > 0) & (base == 0)).sum()),
            "baseline_only": int(((base > 0) & (cand == 0)).sum())}  # fmt: skip


def _side(m: Measured) -> dict[str, Any]:
    return {"id": m.id, "kind": m.kind, "step": m.step, "examples": len(m.results)}


def _not_comparable(baseline: Measured, candidate: Measured) -> tuple[list[str], list[dict[str, Any]]]:
    if baseline.manifest is None or candidate.manifest is None:
        missing = [m.id for m in (baseline, candidate) if m.manifest is None]
        return [f"no manifest recorded for {', '.join(missing)}"], []
    diffs = manifests.differences(baseline.manifest, candidate.manifest)
    reasons = [f"{d['field']} differs: baseline {d['baseline']!r}, candidate {d['candidate']!r}" for d in diffs]
    for m in (baseline, candidate):
        if not m.results:
            reasons.append(f"{m.kind} {m.id} has no per-example results at step {m.step}")
    left = {r.scenario_id for r in baseline.results}
    right = {r.scenario_id for r in candidate.results}
    if left and right and left != right:
        reasons.append(f"the runs scored different scenarios ({len(left ^ right)} not in both)")
    return reasons, diffs


def compare(baseline: Measured, candidate: Measured, *, min_delta: float = 0.0, confidence: float = 0.95,
            resamples: int = 2000) -> dict[str, Any]:  # fmt: skip
    """The gate's verdict with its evidence (see the module docstring)."""
    reasons, diffs = _not_comparable(baseline, candidate)
    verdict: dict[str, Any] = {"baseline": _side(baseline), "candidate": _side(candidate), "min_delta": min_delta,
                               "confidence": confidence, "resamples": resamples, "differences": diffs}  # fmt: skip
    if reasons:
        return {**verdict, "decision": "REJECT", "comparable": False, "reasons": reasons, "overall": None, "outcomes": []}
    by_id = {r.scenario_id: r for r in candidate.results}
    pairs = [(r, by_id[r.scenario_id]) for r in baseline.results]
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, len(pairs), size=(resamples, len(pairs)))
    overall = _paired(np.array([b.correct for b, _ in pairs], float), np.array([c.correct for _, c in pairs], float),
                      picks, confidence)  # fmt: skip
    failures = {r.outcome for side in (baseline.results, candidate.results) for r in side if not r.correct}
    outcomes = []
    for outcome in sorted({r.outcome for b, c in pairs for r in (b, c)}):
        rates = _paired(np.array([b.outcome == outcome for b, _ in pairs], float),
                        np.array([c.outcome == outcome for _, c in pairs], float), picks, confidence)  # fmt: skip
        failure = outcome in failures
        outcomes.append({"outcome": outcome, "failure": failure, "regressed": failure and rates["ci_low"] > 0, **rates})
    if overall["ci_low"] < min_delta:
        reasons.append(f"accuracy delta {overall['delta']:+.4f} has a {confidence:.0%} interval "
                       f"[{overall['ci_low']:+.4f}, {overall['ci_high']:+.4f}] whose lower bound is under min_delta {min_delta}")  # fmt: skip
    for row in outcomes:
        if row["regressed"]:
            reasons.append(f"outcome {row['outcome']} rose from {row['baseline']:.4f} to {row['candidate']:.4f} "
                           f"({confidence:.0%} interval [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}])")  # fmt: skip
    decision = "REJECT" if reasons else "ACCEPT"
    return {**verdict, "decision": decision, "comparable": True, "reasons": reasons, "overall": overall, "outcomes": outcomes}
