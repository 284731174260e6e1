"""Rewriting a trajectory group's rewards without losing anything the group carried."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import art


def rescore(
    group: art.TrajectoryGroup, rewards: Sequence[float], *, metrics: Sequence[dict[str, Any]], logs: Sequence[str]
) -> art.TrajectoryGroup:
    """A copy of ``group`` whose i-th trajectory has ``rewards[i]``, its own reward kept as
    ``metrics["independent_reward"]`` beside ``metrics[i]``, and ``logs[i]`` appended. The group keeps its
    exceptions, metadata, metrics and logs; the input is left alone."""
    rescored = [
        trajectory.model_copy(
            update={
                "reward": reward,
                "metrics": {**trajectory.metrics, "independent_reward": trajectory.reward, **extra},
                "logs": [*trajectory.logs, log],
            }
        )
        for trajectory, reward, extra, log in zip(group.trajectories, rewards, metrics, logs, strict=True)
    ]
    judged = art.TrajectoryGroup(rescored, metadata=dict(group.metadata), metrics=dict(group.metrics), logs=list(group.logs))
    judged.exceptions = list(group.exceptions)  # kept as they were: the constructor would re-wrap them
    return judged
