"""The code graders an operator registered, and the limits they run under. A job names one; nothing else runs.

An operator registers a function with an entry point in the ``artsvc.graders`` group of an installed package
(``exact = "my_graders.math:exact"``: jobs name it ``exact`` or ``my_graders.math:exact``) or with the setting
``grader_functions`` (``ARTSVC_GRADER_FUNCTIONS=my_graders.math:exact``). Reading the registry reads package
metadata only; checking a name is a lookup: neither imports anything, so a client's name never runs code here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType

GROUP = "artsvc.graders"
FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")  # module:function
HOW_TO_REGISTER = (f"an operator registers one with an {GROUP!r} entry point or in ARTSVC_GRADER_FUNCTIONS "
                   "(see docs/judges.md)")  # fmt: skip
NAMES_SHOWN = 20  # of the registered names, in a refusal


@dataclass(frozen=True)
class GraderRegistry:
    """Registered functions: ``entry_points`` maps a name to its ``module:function``; ``functions`` are the
    ``module:function`` targets a job may name directly (every entry point's target among them)."""

    entry_points: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    functions: frozenset[str] = frozenset()

    @classmethod
    def load(cls, functions: Iterable[str] = ()) -> GraderRegistry:
        """The installed ``artsvc.graders`` entry points (read from metadata, not loaded) and ``functions``.
        Raises ValueError for a ``functions`` entry that is not ``module:function``; an entry point whose target
        is not one (``pkg:Class.method``, extras) is left out, as it could not be called."""
        listed = set(functions)
        if bad := sorted(name for name in listed if not FUNCTION.fullmatch(name)):
            raise ValueError(f"grader functions must be 'module:function', not {bad}")
        entry_points = {ep.name: ep.value.strip() for ep in metadata.entry_points(group=GROUP)
                        if FUNCTION.fullmatch(ep.value.strip())}  # fmt: skip
        return cls(MappingProxyType(entry_points), frozenset(listed | set(entry_points.values())))

    def resolve(self, name: str) -> str | None:
        """The ``module:function`` that ``name`` runs: an entry point's target, or ``name`` itself if it is
        registered; None if it is neither."""
        if name in self.entry_points:
            return self.entry_points[name]
        return name if name in self.functions else None

    def refusal(self, name: str) -> str:
        """Why ``name`` may not run, naming what may and how an operator adds to it."""
        names = sorted(self.entry_points) + sorted(self.functions - set(self.entry_points.values()))
        shown = ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "") if names else "none"
        return f"{name[:100]!r} is not a registered grader function (registered: {shown}); {HOW_TO_REGISTER}"


@dataclass(frozen=True)
class CodeGraders:
    """What the operator lets python graders do: the functions that may run, the address space of each call's
    process (MiB) and how many such processes one worker process runs at once. The default runs nothing."""

    registry: GraderRegistry = field(default_factory=GraderRegistry)
    memory_mb: int = 512
    processes: int = 4
