"""Warm-start demonstrations from a deliberately sloppy teacher.

Real base models arrive knowing the task but not the strict format: they slip on spacing, case
and punctuation, and sometimes get the arithmetic wrong. The teacher reproduces that mix so a
policy warm-started on it is honestly imperfect, and RL against the strict scorer has work to do.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping

FORMAT_SLIPS: tuple[Callable[[int], str], ...] = (
    lambda ans: f"Final:  {ans}",  # extra_whitespace
    lambda ans: f"final: {ans}",  # missing_prefix
    lambda ans: f"Final:{ans}",  # extra_whitespace
    lambda ans: f"Final: {ans}.",  # not_integer
    lambda ans: f"The answer is {ans}.",  # missing_prefix
    lambda ans: f"Final: {ans}\nDone.",  # not_single_line
    lambda ans: f"Answer: {ans}",  # missing_prefix
    lambda ans: f"Final: 0{ans}" if ans >= 0 else f"Final: -0{-ans}",  # leading_zeros
)


def sloppy_answer(expected: int, rng: random.Random, *, slip_rate: float, error_rate: float) -> str:
    """One teacher reply: a format slip with ``slip_rate``, a wrong sum with ``error_rate``."""
    draw = rng.random()
    if draw < slip_rate:
        return rng.choice(FORMAT_SLIPS)(expected)
    if draw < slip_rate + error_rate:
        return f"Final: {expected + rng.choice((-10, -2, -1, 1, 2, 10))}"
    return f"Final: {expected}"


def demonstrations(
    rows: list[Mapping], *, seed: int, count: int, slip_rate: float = 0.25, error_rate: float = 0.08
) -> Iterator[tuple[Mapping, str]]:
    """``count`` (scenario, reply) pairs drawn with replacement from ``rows``, deterministic in ``seed``."""
    rng = random.Random(seed)
    for _ in range(count):
        row = rng.choice(rows)
        yield row, sloppy_answer(int(row["expected_answer"]), rng, slip_rate=slip_rate, error_rate=error_rate)
