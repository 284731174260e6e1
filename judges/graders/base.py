"""What every grader shares: the result, the config error, the config base model, and total grading."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_REASON_CHARS = 500  # an error message from foreign code is cut to this in details


class GraderConfigError(ValueError):
    """A grader config is invalid; the message names the field. The only exception graders raise."""


@dataclass(frozen=True)
class GradeResult:
    """A reward in [0, 1] and why. ``details`` always has "grader", "version" and "reason"; it has "error" when the
    sample could not be graded (then the reward is 0.0 and means "no grade", not "a bad answer")."""

    reward: float
    details: dict[str, Any]


class StrictModel(BaseModel):
    """The base of every config model: unknown fields are errors, a parsed config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class GraderModel(StrictModel):
    """The fields every grader config has besides its ``type``."""

    name: str = Field(min_length=1, max_length=64, description="What the grader is called in details and logs.")


class Grader(ABC):
    """One configured grader. ``grade`` is total: whatever the sample and item, it returns a GradeResult."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version

    async def grade(self, sample: dict, item: dict) -> GradeResult:
        """Grade ``sample`` (``{"output_text", "output_json"}``) against ``item`` (the scenario). Never raises:
        a failure is a result with details["error"]."""
        try:
            return await self._grade(sample, item)
        except Exception as exc:  # noqa: BLE001 -- the totality backstop; recorded as an error, never a silent 0
            return self.error(f"internal error: {describe(exc)}")

    @abstractmethod
    async def _grade(self, sample: dict, item: dict) -> GradeResult: ...

    def result(self, reward: float, reason: str, **details: Any) -> GradeResult:
        return GradeResult(float(reward), {"grader": self.name, "version": self.version, "reason": reason, **details})

    def error(self, why: str, **details: Any) -> GradeResult:
        return self.result(0.0, f"not graded: {why}", error=why, **details)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception raised by foreign code, bounded, even if its __str__ raises."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 -- a broken __str__ must not break the error path
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}"[:MAX_REASON_CHARS]


def shown(value: Any, limit: int = 100) -> str:
    """repr() of a value foreign code or arithmetic produced, bounded, even if it cannot be written (an int past
    Python's digit limit, a broken __repr__)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 -- a broken __repr__ must not break the error path
        return f"<unprintable {type(value).__name__}>"
    return text[:limit] + ("..." if len(text) > limit else "")


def snippet(text: str, limit: int = 60) -> str:
    """repr() of the start of ``text``, for reasons that quote what was graded."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def clamp(value: float, lo: float = 0.0, hi: float = 1.0) -> float:
    """``value`` moved into [lo, hi]; the caller records in details that it moved."""
    return min(max(value, lo), hi)


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite real number (bools included), else None."""
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            return None
        return number if math.isfinite(number) else None
    return None
