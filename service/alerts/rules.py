"""Alert rules: pure functions over a job's recorded series (no database, no I/O).

Each rule looks at the whole series and says where its condition *becomes* true, so evaluating
the same series again gives the same alerts and a condition that keeps holding fires once:

- plateau: ``patience`` evaluations without a gain of ``min_delta`` (the stopping rule's own test,
  ``service.store.progress.advance``); fires once, at the first evaluation where it holds.
- divergence: over the last ``divergence_window`` evaluations validation accuracy ends more than
  ``min_delta`` below where the window started and never rises above that start, while the
  least-squares slope of the mean training reward over the steps of that span is positive:
  the reward-hacking signature.
- reward_jump: mean reward rises by more than ``reward_jump`` over one step after
  ``reward_plateau_steps`` steps whose mean rewards span less than ``reward_jump / 2``.
- collapse: ``zero_variance_groups / groups >= collapse_fraction`` (no learning signal).
- kl_spike: KL to the reference above ``kl_threshold``.
- judge_failures: the judge could not score ``judge_failure_rate`` or more of the groups it was
  given so far (counted from the job's start, at least 4 groups in).
- judge_disagreement: the mean, over the last ``judge_agreement_window`` judged steps, of the
  per-group rank correlation between RULER scores and the trajectories' own rewards is under
  ``judge_agreement``: the judge no longer ranks as the environment's scorer does.

The last four are read step by step, and a healthy job's readings wander across a threshold (the main job's KL
crossed 0.5 eight times in 36 steps): each fires again only after ``rearm_steps`` of its rows in a row clear of it.

A condition is judged from the rows up to its own step only, so rows recorded later never
change an alert that was already given. That lets the store evaluate the newest rows alone, with
what came before them summed up in a :class:`Before` (service/alerts/window.py says how far back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.spec import AlertSpec, ValidationSpec
from service.store.progress import Progress, advance

KINDS = ("plateau", "divergence", "reward_jump", "collapse", "kl_spike", "judge_failures", "judge_disagreement")
POINT_KINDS = ("plateau", "divergence")  # alerts at validation points; the others are at training steps
JUDGE_FAILURES_MIN_GROUPS = 4  # a rate over fewer groups says little


@dataclass(frozen=True)
class StepPoint:
    """The numbers of one training step the rules read."""

    step: int
    reward_mean: float
    groups: int
    zero_variance_groups: int
    kl: float | None = None
    judge_groups: int = 0  # groups given to the judge (judged modes)
    judge_dropped_groups: int = 0  # of which it scored none
    judge_agreement: float | None = None  # mean rank correlation of RULER scores with the own rewards


@dataclass(frozen=True)
class ValPoint:
    step: int
    accuracy: float


@dataclass(frozen=True)
class Before:
    """What a job's series held before the rows given to :func:`evaluate` (by default nothing: a whole series)."""

    progress: Progress | None = None  # the validation points before, folded as the stopping rules fold them
    judge_groups: int = 0  # the steps before: groups given to the judge
    judge_dropped_groups: int = 0  # and of those, the groups it scored none of
    judged: tuple[StepPoint, ...] = ()  # judged steps before the rows, oldest first (for judge_disagreement)


@dataclass(frozen=True)
class Candidate:
    """An alert a rule gives: what fired, where, and the exact numbers that fired it."""

    kind: str
    step: int
    message: str
    evidence: dict[str, Any]


def evaluate(
    steps: Sequence[StepPoint],
    points: Sequence[ValPoint],
    *,
    alerts: AlertSpec,
    validation: ValidationSpec,
    before: Before = Before(),
) -> list[Candidate]:
    """Every alert the series holds, ordered by step then kind; at most one per (kind, step). With ``before``,
    the rows are the newest of a longer series, and only alerts with enough of them behind hold for it."""
    steps = sorted(steps, key=lambda s: s.step)
    points = sorted(points, key=lambda p: p.step)
    judged = [*before.judged, *(s for s in steps if s.judge_agreement is not None)]
    found = [
        *_plateau(points, validation, before.progress),
        *_divergence(steps, points, window=alerts.divergence_window, min_delta=validation.min_delta),
        *_reward_jump(steps, jump=alerts.reward_jump, plateau_steps=alerts.reward_plateau_steps),
        *_collapse(steps, fraction=alerts.collapse_fraction, rearm=alerts.rearm_steps),
        *_kl_spike(steps, threshold=alerts.kl_threshold, rearm=alerts.rearm_steps),
        *_judge_failures(steps, rate=alerts.judge_failure_rate, before=before, rearm=alerts.rearm_steps),
        *_judge_disagreement(judged, threshold=alerts.judge_agreement, window=alerts.judge_agreement_window,
                             rearm=alerts.rearm_steps),
    ]
    return sorted(found, key=lambda c: (c.step, KINDS.index(c.kind)))


def _fire(kind: str, rows: Sequence[StepPoint] | Sequence[ValPoint], found: list[dict[str, Any] | None],
          message: Callable[[dict[str, Any]], str], rearm: int = 1) -> list[Candidate]:  # fmt: skip
    """A candidate at each row where the rule's evidence appears: present there, absent from the ``rearm`` rows
    just before (the rows before the first count as absent)."""
    return [
        Candidate(kind, rows[i].step, message(evidence), evidence)
        for i, evidence in enumerate(found)
        if evidence is not None and all(e is None for e in found[max(0, i - rearm) : i])
    ]


def _plateau(points: Sequence[ValPoint], validation: ValidationSpec, progress: Progress | None) -> list[Candidate]:
    found: list[dict[str, Any] | None] = []
    for p in points:
        progress = advance(progress, p.step, p.accuracy, min_delta=validation.min_delta)
        holds = progress.evaluations_without_gain >= validation.patience
        found.append({"evaluations_without_gain": progress.evaluations_without_gain, "patience": validation.patience,
                      "min_delta": validation.min_delta, "best_step": progress.best_step,
                      "best_accuracy": progress.best_accuracy, "accuracy": p.accuracy} if holds else None)  # fmt: skip

    def message(e: dict[str, Any]) -> str:
        return (f"validation accuracy has not gained {e['min_delta']} in {e['evaluations_without_gain']} evaluations "
                f"(best {e['best_accuracy']:.4f} at step {e['best_step']})")  # fmt: skip

    return _fire("plateau", points, found, message)[:1]  # once


def _divergence(
    steps: Sequence[StepPoint], points: Sequence[ValPoint], *, window: int, min_delta: float
) -> list[Candidate]:
    def at(i: int) -> dict[str, Any] | None:
        if i + 1 < window:
            return None
        evals = points[i + 1 - window : i + 1]
        first, last = evals[0].accuracy, evals[-1].accuracy
        if not (first - last > min_delta and all(p.accuracy <= first for p in evals)):
            return None
        trained = [s for s in steps if evals[0].step < s.step <= evals[-1].step]
        slope = _slope([s.step for s in trained], [s.reward_mean for s in trained])
        if slope is None or not slope > 0:
            return None
        return {"val_steps": [p.step for p in evals], "val_accuracy": [p.accuracy for p in evals],
                "val_drop": first - last, "min_delta": min_delta, "reward_slope": slope, "reward_steps": len(trained),
                "reward_first": trained[0].reward_mean, "reward_last": trained[-1].reward_mean}  # fmt: skip

    def message(e: dict[str, Any]) -> str:
        return (f"validation accuracy fell {e['val_accuracy'][0]:.4f} -> {e['val_accuracy'][-1]:.4f} over steps "
                f"{e['val_steps'][0]}-{e['val_steps'][-1]} while training reward rose {e['reward_slope']:+.4g}/step: "
                "possible reward hacking")  # fmt: skip

    return _fire("divergence", points, [at(i) for i in range(len(points))], message)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two distinct xs."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def _reward_jump(steps: Sequence[StepPoint], *, jump: float, plateau_steps: int) -> list[Candidate]:
    def at(i: int) -> dict[str, Any] | None:
        if i < plateau_steps:
            return None
        before = [s.reward_mean for s in steps[i - plateau_steps : i]]
        rise, spread = steps[i].reward_mean - before[-1], max(before) - min(before)
        if not (rise > jump and spread < jump / 2):
            return None
        return {"reward_before": before[-1], "reward": steps[i].reward_mean, "rise": rise, "threshold": jump,
                "plateau_steps": plateau_steps, "plateau_range": spread}  # fmt: skip

    def message(e: dict[str, Any]) -> str:
        return (f"mean reward jumped {e['reward_before']:.4f} -> {e['reward']:.4f} in one step after "
                f"{plateau_steps} flat steps: inspect the rollouts")  # fmt: skip

    return _fire("reward_jump", steps, [at(i) for i in range(len(steps))], message)


def _collapse(steps: Sequence[StepPoint], *, fraction: float, rearm: int) -> list[Candidate]:
    def at(s: StepPoint) -> dict[str, Any] | None:
        share = s.zero_variance_groups / s.groups if s.groups > 0 else 0.0
        if share < fraction:
            return None
        return {"zero_variance_groups": s.zero_variance_groups, "groups": s.groups, "fraction": share,
                "threshold": fraction}  # fmt: skip

    def message(e: dict[str, Any]) -> str:
        return f"{e['zero_variance_groups']} of {e['groups']} groups have zero reward variance: no learning signal"

    return _fire("collapse", steps, [at(s) for s in steps], message, rearm)


def _kl_spike(steps: Sequence[StepPoint], *, threshold: float, rearm: int) -> list[Candidate]:
    found = [{"kl": s.kl, "threshold": threshold} if s.kl is not None and s.kl > threshold else None for s in steps]
    return _fire("kl_spike", steps, found, lambda e: f"KL to the reference is {e['kl']:.4g} nats, past {threshold}", rearm)


def _judge_failures(steps: Sequence[StepPoint], *, rate: float, before: Before, rearm: int) -> list[Candidate]:
    given, dropped, found = before.judge_groups, before.judge_dropped_groups, []
    for s in steps:
        given, dropped = given + s.judge_groups, dropped + s.judge_dropped_groups
        holds = given >= JUDGE_FAILURES_MIN_GROUPS and dropped / given >= rate
        found.append({"dropped_groups": dropped, "judged_groups": given, "rate": dropped / given, "threshold": rate}
                     if holds else None)  # fmt: skip

    def message(e: dict[str, Any]) -> str:
        return f"the judge could not score {e['dropped_groups']} of {e['judged_groups']} groups ({e['rate']:.0%}): check the judge"

    return _fire("judge_failures", steps, found, message, rearm)


def _judge_disagreement(judged: Sequence[StepPoint], *, threshold: float, window: int, rearm: int) -> list[Candidate]:
    def at(i: int) -> dict[str, Any] | None:
        if i + 1 < window:
            return None
        recent = [s.judge_agreement for s in judged[i + 1 - window : i + 1]]
        mean = sum(recent) / window  # type: ignore[arg-type]
        if mean >= threshold:
            return None
        return {"agreement": mean, "threshold": threshold, "window": window, "steps": [s.step for s in judged[i + 1 - window : i + 1]]}

    def message(e: dict[str, Any]) -> str:
        return (f"RULER scores and the environment's own rewards rank trajectories differently (mean rank correlation "
                f"{e['agreement']:+.3f} over {e['window']} steps, under {e['threshold']}): read the rollouts")  # fmt: skip

    return _fire("judge_disagreement", judged, [at(i) for i in range(len(judged))], message, rearm)
