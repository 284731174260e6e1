"""Deterministic generation of the 2048 scenarios and their committed splits.

A scenario is a game seed: the seed fixes the two opening tiles and every later spawn, so a
scenario is the same game for every policy that plays the same moves. Seeds are drawn without
replacement, so no val or test game is a train game. Run ``python -m environments.twenty48.scenarios``
to regenerate the package data folder ``environments/twenty48/data/``.
"""

from __future__ import annotations

import json
import random
from importlib.resources import files
from pathlib import Path

GENERATOR_SEED = 20480417
SPLIT_SIZES = {"train": 10000, "val": 200, "test": 200}
SEED_SPACE = 2**31
# Package data (pyproject.toml), read through importlib.resources so that any install finds it; a pathlib.Path when
# the package is a folder on disk, as in the checkout the generator writes to.
SCENARIO_DIR = files("environments.twenty48") / "data"


def generate_splits(seed: int = GENERATOR_SEED) -> dict[str, list[dict]]:
    """All splits, deterministically from ``seed``, with pairwise disjoint game seeds."""
    seeds = iter(random.Random(seed).sample(range(SEED_SPACE), sum(SPLIT_SIZES.values())))
    return {
        split: [{"id": f"2048-{split}-{i:05d}", "seed": next(seeds)} for i in range(size)]
        for split, size in SPLIT_SIZES.items()
    }


def canonical_bytes(rows: list[dict]) -> bytes:
    """The JSONL bytes a split is stored (and fingerprinted) as."""
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode()


def write_splits(directory: Path = SCENARIO_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in generate_splits().items():
        (directory / f"{split}.jsonl").write_bytes(canonical_bytes(rows))


if __name__ == "__main__":
    write_splits()
    print(f"wrote {', '.join(f'{n} {s}' for s, n in SPLIT_SIZES.items())} scenarios to {SCENARIO_DIR}")
