"""Environments: where rollouts happen. Built-ins and plugins are found through the
``artsvc.environments`` entry-point group; see :mod:`environments.base` for the interface."""

import os

# litellm (imported by ART) fetches a price map at import unless told to use its local copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from environments.base import (  # noqa: E402
    SPLITS,
    BaseEnvironment,
    Environment,
    EnvironmentConfigError,
    Sampling,
    UnknownEnvironmentError,
    arguments_of,
    available,
    load,
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
]
