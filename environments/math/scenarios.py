"""Deterministic generation of the math scenarios and their committed splits.

Problems are additions of two integers from 0 to 99 whose digit sums carry nothing (each
answer digit is the sum of two operand digits), as bare expressions or as short word problems.
The mix is what a 0.8M-parameter character policy learns on two CPU cores in minutes while
reading its answer most-significant digit first: with carries, or with subtraction, the same
warm start stayed between 20% and 50% greedy accuracy on held-out pairs, too weak for RL to
have a clean signal.
Splits are disjoint by the underlying pair ``(a, b)``, so no val or test question is a rewording
of a train question. Run ``python -m environments.math.scenarios`` to regenerate ``scenarios/math/``.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

GENERATOR_SEED = 20261122
SPLIT_SIZES = {"train": 20000, "val": 200, "test": 200}
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "math"

NAMES = ("Ana", "Ben", "Kim", "Lou", "Mia", "Raj")
ITEMS = ("apples", "books", "coins", "cards", "shells", "stamps")
TEMPLATES = (
    "What is {a} + {b}?",
    "Compute {a} + {b}.",
    "How many {item} in all? {name} has {a}, {other} has {b}.",
)


def _carry_free_pair(rng: random.Random) -> tuple[int, int]:
    while True:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10:
            return a, b


def _problem(rng: random.Random) -> tuple[tuple[int, int], dict]:
    template = rng.choice(TEMPLATES)
    a, b = _carry_free_pair(rng)
    name, other = rng.sample(NAMES, 2)
    prompt = template.format(a=a, b=b, name=name, other=other, item=rng.choice(ITEMS))
    return (a, b), {"prompt": prompt, "expected_answer": a + b}


def generate_splits(seed: int = GENERATOR_SEED) -> dict[str, list[dict]]:
    """All splits, deterministically from ``seed``; held-out expressions never appear in train."""
    rng = random.Random(seed)
    held_out: set[tuple[int, int]] = set()
    splits: dict[str, list[dict]] = {}
    for split in ("val", "test", "train"):
        rows: list[dict] = []
        while len(rows) < SPLIT_SIZES[split]:
            key, row = _problem(rng)
            if key in held_out:
                continue
            if split != "train":
                held_out.add(key)
            rows.append({"id": f"math-{split}-{len(rows):05d}", **row})
        splits[split] = rows
    return splits


def canonical_bytes(rows: list[dict]) -> bytes:
    """The JSONL bytes a split is stored and fingerprinted as."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=True) + "\n" for r in rows).encode()


def fingerprint(rows: list[dict]) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(rows)).hexdigest()


def write_splits(directory: Path = SCENARIO_DIR) -> dict[str, str]:
    """Write every split and ``fingerprints.json``; returns the fingerprints."""
    directory.mkdir(parents=True, exist_ok=True)
    fingerprints = {}
    for split, rows in generate_splits().items():
        (directory / f"{split}.jsonl").write_bytes(canonical_bytes(rows))
        fingerprints[split] = fingerprint(rows)
    (directory / "fingerprints.json").write_text(json.dumps(fingerprints, indent=2, sort_keys=True) + "\n")
    return fingerprints


if __name__ == "__main__":
    for name, value in write_splits().items():
        print(f"{name}: {value}")
