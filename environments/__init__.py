"""Environments: where rollouts happen. Built-ins and plugins are found through the
``artsvc.environments`` entry-point group; see :mod:`environments.base` for the interface."""

from environments.base import (
    SPLITS,
    BaseEnvironment,
    Environment,
    EnvironmentConfigError,
    Sampling,
    UnknownEnvironmentError,
    arguments_of,
    available,
    load,
    new_trajectory,
)

__all__ = [
    "SPLITS",
    "BaseEnvironment",
    "Environment",
    "EnvironmentConfigError",
    "Sampling",
    "UnknownEnvironmentError",
    "arguments_of",
    "available",
    "load",
    "new_trajectory",
]
