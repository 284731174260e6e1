"""Best-of-N selection and unbiased pass@k: measurement instruments for Loop B (selection).

Selection changes which sample is reported, never the policy, so its numbers are labelled as selection. All is
deterministic: the same candidates, in any order, give the same choice and digest ("same output hash over 5 runs").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "SelectionReport", "mean_pass_at_k", "pass_at_k", "select", "select_best"]


@dataclass(frozen=True)
class Candidate:
    """One sampled completion of one example, as scored and verified."""

    index: int  # sample number within the example (0..n-1); for reporting, a tie-break only among exact duplicates
    completion: str  # the text that is scored and shown
    reward: float  # the scorer's reward
    correct: bool  # the verifier's verdict
    sum_logprob: float | None = None  # summed token logprobs of the completion, if the backend reported them


def _descending(value: float | None) -> tuple[int, float]:
    """Sort key putting higher numbers first, then NaN, then None: a total order, unlike bare floats."""
    if value is None:
        return (2, 0.0)
    if math.isnan(value):
        return (1, 0.0)
    return (0, -value)


def _rank(candidate: Candidate) -> tuple:
    """Smaller is better: reward, then logprob, then shorter, then lexicographically smaller text, then lower
    index; repr last, so even candidates equal in all of those (0.0 against -0.0) are told apart the same way."""
    return (
        _descending(candidate.reward),
        _descending(candidate.sum_logprob),
        len(candidate.completion),
        candidate.completion,
        candidate.index,
        repr(candidate),
    )


def select_best(candidates: Sequence[Candidate]) -> Candidate:
    """The best candidate: highest reward (NaN below every number); ties go to the higher sum_logprob (None
    and NaN below any number), then the shorter completion, then the lexicographically smaller one, then the
    lower index. The choice does not depend on the order of ``candidates``. Raises ValueError if it is empty."""
    if not candidates:
        raise ValueError("select_best needs at least one candidate")
    return min(candidates, key=_rank)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k),
    in the stable product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), so no huge binomials. Raises ValueError
    unless 1 <= k <= n and 0 <= c <= n."""
    if k < 1 or k > n:
        raise ValueError(f"k must be within 1..n (n={n}), got k={k}")
    if c < 0 or c > n:
        raise ValueError(f"c must be within 0..n (n={n}), got c={c}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over examples of pass_at_k(n, c, k), one (n, c) pair per example. Raises ValueError on no
    examples or on any pair pass_at_k refuses."""
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one example")
    return math.fsum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


@dataclass(frozen=True)
class SelectionReport:
    """What best-of-N selection measured over a set of examples, each with n candidates."""

    n: int  # candidates per example
    examples: int  # number of examples
    selected_accuracy: float  # share of examples whose selected candidate is correct (best-of-N: selection)
    pass_at: dict[int, float]  # k -> mean unbiased pass@k; pass_at[1] is the mean single-sample accuracy
    selected: list[Candidate]  # the selected candidate per example, in example order
    digest: str  # sha256 over the selected (example position, index, completion, reward): equal runs, equal digests
    label: str = "selection (best-of-N by reward), not learning: the policy is unchanged"


def _digest(selected: Sequence[Candidate]) -> str:
    """sha256 of one JSON line per selected candidate; ASCII-escaped text and repr'd rewards keep it exact."""
    lines = (json.dumps([p, c.index, c.completion, repr(float(c.reward))]) for p, c in enumerate(selected))
    return hashlib.sha256("\n".join(lines).encode("ascii")).hexdigest()


def select(examples: Sequence[Sequence[Candidate]], *, ks: Sequence[int] = (1,)) -> SelectionReport:
    """Select the best candidate of every example and measure pass@k for each k in ``ks`` (deduplicated,
    sorted). Raises ValueError on no examples, on an example whose candidate count differs from the first's
    or is 0 (naming the example index), or on a k outside 1..n."""
    if not examples:
        raise ValueError("select needs at least one example")
    n = len(examples[0])
    for position, candidates in enumerate(examples):
        if len(candidates) != n or n < 1:
            raise ValueError(f"example {position} has {len(candidates)} candidates; all need the same n >= 1 (n={n})")
    wanted = sorted(set(ks))
    if not wanted or wanted[0] < 1 or wanted[-1] > n:
        raise ValueError(f"ks must be non-empty and within 1..n (n={n}), got {list(ks)}")
    selected = [select_best(candidates) for candidates in examples]
    counts = [(n, sum(1 for c in candidates if c.correct)) for candidates in examples]
    return SelectionReport(
        n=n,
        examples=len(examples),
        selected_accuracy=sum(1 for c in selected if c.correct) / len(selected),
        pass_at={k: mean_pass_at_k(counts, k) for k in wanted},
        selected=selected,
        digest=_digest(selected),
    )
