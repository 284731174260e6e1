"""What one execution of a training job holds while it runs, and how its parts record what operators read."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import art
from sqlalchemy.engine import Engine
from sqlmodel import Session

from environments.base import Environment
from judges.usage import JudgeBudget
from service.runner.control import JobHooks, StopCheck, fenced
from service.spec import JobSpec
from service.store.tables import Alert
from service.training.judging import Judge


@dataclass
class Run:
    """What one execution of a job holds while it runs."""

    job_id: str
    spec: JobSpec
    env: Environment
    model: art.TrainableModel
    backend: art.Backend
    db: Engine
    hooks: JobHooks = field(default_factory=JobHooks)
    judge: Judge | None = None
    budget: JudgeBudget = field(default_factory=lambda: JudgeBudget(None))  # the judge's, shared by its calls
    baseline_accuracy: float | None = None  # the baseline model's accuracy on the validation examples
    check_stop: StopCheck = field(init=False)  # asked inside long phases: JobCancelled, JobInterrupted

    def __post_init__(self) -> None:
        self.check_stop = StopCheck(self.db, self.hooks, self.job_id)

    def session(self) -> Session:
        """A session to read the store (writes go through ``write``)."""
        return Session(self.db, expire_on_commit=False)

    def write(self) -> AbstractContextManager[Session]:
        """A transaction writing the job, committed at the end of the block, only while this process holds it."""
        return fenced(self.db, self.hooks, self.job_id)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        self.hooks.on_event(kind, data)

    def announce(self, alerts: list[Alert]) -> None:
        """Hand alerts just committed to the process (a worker posts them to a webhook), each as an event too."""
        if alerts:
            self.hooks.on_alert(alerts)
            for alert in alerts:
                self.on_event("alert", {"kind": alert.kind, "step": alert.step, "message": alert.message})


def sampled(trajectories_by_group: Sequence[Sequence[art.Trajectory]], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` rollouts, whole groups first, as rows an operator can read."""
    rows: list[dict[str, Any]] = []
    for group_index, trajectories in enumerate(trajectories_by_group):
        for trajectory in trajectories:
            if len(rows) >= limit:
                return rows
            scenario_id = trajectory.metadata.get("scenario_id")
            rows.append(
                {
                    "group_index": group_index,
                    "scenario_id": None if scenario_id is None else str(scenario_id),
                    "reward": trajectory.reward,
                    "messages": trajectory.messages(),
                    "details": {"metadata": trajectory.metadata, "metrics": trajectory.metrics, "logs": trajectory.logs},
                }
            )
    return rows
