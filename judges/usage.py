"""What judge calls cost: tokens and dollars, read from each response through ART's own metrics hook, and the
budget a job's judge calls are held to.

ART's ``ruler`` hands every judge response to ``MetricsBuilder.get_active().add_response_cost`` (the
hook ART uses to account judge cost in its metrics). A ``UsageMeter`` activated around a call is that
builder for the call's context only, so concurrent calls never mix their counts, and it prices the
response with litellm's local price map.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any

from art.metrics import MetricsBuilder


@dataclass
class JudgeUsage:
    """Responses received, their tokens and their cost. ``unpriced`` counts responses whose model
    litellm has no price for (a private model behind ``api_base``): their cost is not in ``cost_usd``."""

    responses: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced: int = 0

    def add(self, other: JudgeUsage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_metrics(self, prefix: str = "judge_") -> dict[str, float]:
        return {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}


def response_cost(response: Any, model: str) -> float | None:
    """litellm's price of ``response`` in USD, or None when it has none for the model."""
    import litellm

    try:
        cost = litellm.completion_cost(completion_response=response, model=model)
    except Exception:  # litellm raises a bare Exception for a model missing from its map
        return None
    return float(cost) if cost is not None and math.isfinite(cost) else None


class UsageMeter(MetricsBuilder):
    """Counts what the judge responses seen in its context cost (activate with ``activate_context``)."""

    def __init__(self, model: str) -> None:
        super().__init__("judge")
        self.model = model
        self.usage = JudgeUsage()

    def add_response_cost(self, source: str, response: Any, **_: Any) -> float | None:
        usage = getattr(response, "usage", None)
        self.usage.responses += 1
        self.usage.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
        self.usage.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
        cost = response_cost(response, self.model)
        if cost is None:
            self.usage.unpriced += 1
        else:
            self.usage.cost_usd += cost
        return cost


class BudgetSpent(Exception):
    """The job's judge budget is spent: no more judge calls are made."""


class JudgeBudget:
    """A job's judge spending limit in USD (None: unbounded), checked before each judge call and charged with what
    each call cost, a failed or retried one included.

    Calls run side by side while the budget has room for one more beside those in flight, each priced at the
    dearest call seen so far; until a call's price is known, and near the limit, one at a time. So the job
    stops having spent at most the limit plus about one call (calls of one job cost about the same)."""

    def __init__(self, limit_usd: float | None, *, spent_usd: float = 0.0) -> None:
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self._in_flight = 0
        self._dearest: float | None = None  # the most one call has cost
        self._changed = asyncio.Event()

    @property
    def spent(self) -> bool:
        return self.limit_usd is not None and self.spent_usd >= self.limit_usd

    @asynccontextmanager
    async def admitted(self, usage: JudgeUsage) -> AsyncIterator[None]:
        """Wait until one more call fits (BudgetSpent if the budget is spent), then charge ``usage`` as it stands when
        the block ends, however it ends."""
        while not self._room():
            self._changed.clear()
            await self._changed.wait()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self.spent_usd += usage.cost_usd
            if usage.responses:
                self._dearest = max(self._dearest or 0.0, usage.cost_usd)
            self._changed.set()

    def _room(self) -> bool:
        if self.spent:
            raise BudgetSpent(f"the judge budget of ${self.limit_usd} is spent (${self.spent_usd:.6f})")
        if self.limit_usd is None or self._in_flight == 0:
            return True
        return self._dearest is not None and self.spent_usd + (self._in_flight + 1) * self._dearest <= self.limit_usd
