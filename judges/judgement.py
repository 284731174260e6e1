"""What every judge returns for one trajectory group (RULER, a grader): the contract the training loop reads.

A judge is an object with ``async judge(group) -> GroupJudgement`` that never raises for anything the judge
does: a group it could not score comes back dropped (``group`` None) with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from judges.usage import JudgeUsage

if TYPE_CHECKING:
    import art


RETRY_KINDS = ("timeout", "rate_limited", "server_error", "malformed")  # why a judge call is tried again


@dataclass(frozen=True)
class Retry:
    """One judge call that failed and was tried again: its kind (one of RETRY_KINDS) and the error it gave."""

    kind: str
    reason: str


@dataclass
class GroupJudgement:
    """How judging one group went: the rescored group, or None and why it was dropped."""

    group: art.TrajectoryGroup | None
    attempts: int
    usage: JudgeUsage
    failure: str | None = None
    clamped: list[str] = field(default_factory=list)
    retried: list[Retry] = field(default_factory=list)
