"""How much of a job's series decides the alerts at its newest rows (the rules: service/alerts/rules.py).

A rule's alert at a row depends on the rows up to it alone, and ``check_alerts`` runs after every new
step row and validation point, so only the newest step and the newest point can hold an alert that an
earlier call has not stored. Deciding those (whether the condition holds there, and did not just before) takes:

- collapse, kl_spike: the newest ``rearm_steps + 1`` steps (each fires again only after that many clear rows);
- judge_failures: the newest ``rearm_steps + 1`` steps and the counts of the steps before (their running totals);
- reward_jump: ``reward_plateau_steps + 2`` steps;
- divergence: ``divergence_window + 1`` points, and every step after the oldest of them (the reward slope);
- plateau: the newest two points and the stopping fold before them (stored on the point before), and
  whether it fired already (it fires once: the store's alerts say);
- judge_disagreement: the ``judge_agreement_window + rearm_steps`` newest judged steps, however far back they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.alerts.rules import POINT_KINDS, Candidate
from service.spec import AlertSpec


def step_rows(alerts: AlertSpec) -> int:
    """The newest steps to read (and any after the oldest point read)."""
    return max(alerts.reward_plateau_steps + 2, alerts.rearm_steps + 1)


def point_rows(alerts: AlertSpec) -> int:
    """The newest validation points to read, not counting the one before them that gives the fold."""
    return alerts.divergence_window + 1


def judged_rows(alerts: AlertSpec) -> int:
    """The newest judged steps to read."""
    return alerts.judge_agreement_window + alerts.rearm_steps


def fresh(candidates: Sequence[Candidate], *, newest_step: int | None, newest_point: int | None) -> list[Candidate]:
    """The candidates at the newest rows: the only ones an evaluation of the window decides for the whole series."""
    return [c for c in candidates if c.step == (newest_point if c.kind in POINT_KINDS else newest_step)]
