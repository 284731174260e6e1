"""The environment plugin interface and the registry that finds environments.

An environment is one class registered under the entry-point group ``artsvc.environments``.
The training loop only ever talks to it through :class:`Environment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import art

ENTRY_POINT_GROUP = "artsvc.environments"


@dataclass(frozen=True)
class Sampling:
    """How a rollout samples from the policy; the loop picks it per step and per split."""

    temperature: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None  # None: the environment's own limit


@runtime_checkable
class Environment(Protocol):
    name: str
    version: str
    scorer_name: str
    scorer_version: str

    def scenarios(self, split: str) -> Sequence[dict[str, Any]]:
        """Rows of ``split`` (train, val, test), in a fixed order; each has an ``id``."""

    def fingerprints(self) -> dict[str, str]:
        """sha256 fingerprint of every split, for run manifests."""

    async def rollout(self, model: art.Model, scenario: dict[str, Any], sampling: Sampling) -> art.Trajectory:
        """Play ``scenario`` against ``model`` and return the scored trajectory."""

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        """Whether a validation trajectory counts towards validation accuracy."""

    def demonstrations(self, *, seed: int, count: int) -> list[art.Trajectory]:
        """Warm-start trajectories (assistant turns as plain messages); may be empty."""


class UnknownEnvironmentError(LookupError):
    """No environment of that name is installed."""


def available() -> dict[str, Any]:
    """Installed environments by name (entry points, not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load(name: str) -> Environment:
    """An instance of the environment registered as ``name``.

    Raises UnknownEnvironmentError naming the installed ones.
    """
    found = available()
    if name not in found:
        installed = ", ".join(sorted(found)) or "none (is the package installed with pip install -e .?)"
        raise UnknownEnvironmentError(f"unknown environment {name!r}; installed: {installed}")
    return found[name].load()()
