"""Deterministic choices of a run, as pure functions of (job seed, step, ...), so a resumed run
picks exactly what the uninterrupted run would have picked."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def batch_for_step(rows: Sequence[T], *, seed: int, step: int, size: int) -> list[T]:
    """Training scenarios of ``step`` (1-based): epochs of seeded shuffles of ``rows``, in order."""
    if not rows:
        raise ValueError("the train split is empty")
    start = (step - 1) * size
    picked: list[T] = []
    while len(picked) < size:
        epoch, offset = divmod(start + len(picked), len(rows))
        order = list(range(len(rows)))
        random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
        take = min(size - len(picked), len(rows) - offset)
        picked.extend(rows[i] for i in order[offset : offset + take])
    return picked
