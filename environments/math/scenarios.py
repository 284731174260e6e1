"""Deterministic generation of the math levels and their committed splits.

The default level, ``carry_free``, is additions of two integers from 0 to 99 whose digit sums carry
nothing, as bare expressions or as short word problems. It is what a 0.8M-parameter character policy
learns on two CPU cores in minutes while reading its answer most-significant digit first: with carries,
or with subtraction, the same warm start stayed between 20% and 50% greedy accuracy on held-out pairs,
too weak for RL to have a clean signal. The other levels (see :data:`LEVELS`) are for real LLMs.

Every level has its own seed, its own splits and its own ``fingerprints.json`` (the default level's
in the package data folder ``environments/math/data/``, the others' in ``data/<level>/``). Splits are
disjoint by the problem's key (see :mod:`environments.math.problems`), so no val or test question is a
rewording of a train question. Run ``python -m environments.math.scenarios [LEVEL ...]`` to regenerate them.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from environments.math import problems

GENERATOR_SEED = 20261122  # the default level's
SPLIT_SIZES = {"train": 20000, "val": 200, "test": 200}  # the default level's
LEVEL_SPLIT_SIZES = {"train": 4000, "val": 200, "test": 200}  # every other level's
# Package data (pyproject.toml), read through importlib.resources so that any install finds it; a pathlib.Path when
# the package is a folder on disk, as in the checkout the generator writes to.
SCENARIO_DIR = files("environments.math") / "data"


@dataclass(frozen=True)
class Level:
    name: str
    what: str  # one line, for the docs and error messages
    problem: Callable[[random.Random], problems.Problem]
    seed: int
    sizes: dict[str, int]
    folder: str  # where its splits are, under SCENARIO_DIR ("" for the default level's)
    id_prefix: str  # row ids are f"{id_prefix}-{split}-{index:05d}"

    @property
    def directory(self) -> Traversable:
        return SCENARIO_DIR / self.folder


def _level(name: str, what: str, problem: Callable, seed: int) -> Level:
    return Level(name, what, problem, seed, LEVEL_SPLIT_SIZES, name, f"math-{name}")


DEFAULT_LEVEL = "carry_free"
LEVELS = {
    level.name: level
    for level in (
        Level(DEFAULT_LEVEL, "a + b, 0-99, no carry", problems.carry_free, GENERATOR_SEED, SPLIT_SIZES, "", "math"),
        _level("carries", "a + b, 0-99, at least one carry", problems.carries, GENERATOR_SEED + 1),
        _level("subtraction", "a - b, 0-99, answers may be negative", problems.subtraction, GENERATOR_SEED + 2),
        _level("multiplication", "a x b, 2-99 times 2-12", problems.multiplication, GENERATOR_SEED + 3),
        _level("word_problems", "two-step word problems (buy, give away, more than, bags of)", problems.word_problems,
               GENERATOR_SEED + 4),  # fmt: skip
    )
}


def level_named(name: object) -> Level:
    """The level called ``name``; ValueError naming the levels otherwise."""
    if not isinstance(name, str) or name not in LEVELS:
        raise ValueError(f"unknown math level {name!r}; levels are {', '.join(LEVELS)}")
    return LEVELS[name]


def generate_splits(level: str = DEFAULT_LEVEL, seed: int | None = None) -> dict[str, list[dict]]:
    """All splits of ``level``, deterministically from ``seed`` (the level's own by default); held-out
    problems never appear in train, and val and test share none."""
    spec = level_named(level)
    rng = random.Random(spec.seed if seed is None else seed)
    held_out: set = set()
    splits: dict[str, list[dict]] = {}
    for split in ("val", "test", "train"):
        rows: list[dict] = []
        while len(rows) < spec.sizes[split]:
            key, row = spec.problem(rng)
            if key in held_out:
                continue
            if split != "train":
                held_out.add(key)
            rows.append({"id": f"{spec.id_prefix}-{split}-{len(rows):05d}", **row})
        splits[split] = rows
    return splits


def canonical_bytes(rows: list[dict]) -> bytes:
    """The JSONL bytes a split is stored and fingerprinted as."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=True) + "\n" for r in rows).encode()


def fingerprint(rows: list[dict]) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(rows)).hexdigest()


def write_splits(level: str = DEFAULT_LEVEL, directory: Path | None = None) -> dict[str, str]:
    """Write every split of ``level`` and its ``fingerprints.json``; returns the fingerprints."""
    directory = level_named(level).directory if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    fingerprints = {}
    for split, rows in generate_splits(level).items():
        (directory / f"{split}.jsonl").write_bytes(canonical_bytes(rows))
        fingerprints[split] = fingerprint(rows)
    (directory / "fingerprints.json").write_text(json.dumps(fingerprints, indent=2, sort_keys=True) + "\n")
    return fingerprints


if __name__ == "__main__":
    for level_name in sys.argv[1:] or LEVELS:
        for split, value in write_splits(level_name).items():
            print(f"{level_name} {split}: {value}")
