"""Learning-rate schedules, handed to backends as per-batch lists (ART's ``TrainSFTConfig`` takes one)."""

from __future__ import annotations

import math


def cosine_schedule(peak: float, steps: int, *, warmup: int = 50, floor: float = 0.1) -> list[float]:
    """Per-batch learning rates: linear warm-up, then cosine decay to ``floor * peak``."""
    rates = []
    for i in range(steps):
        warm = min(1.0, (i + 1) / max(1, warmup))
        decay = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * i / max(1, steps)))
        rates.append(peak * warm * decay)
    return rates
