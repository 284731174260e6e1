"""Integer arithmetic with a strict ``Final: <int>`` answer format.

The package exports its environment class only; the scorer, the levels and the generator are imported from their
modules. The class loads on first use, so that ``python -m environments.math.scenarios`` (which regenerates the
data) runs without importing ART.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from environments.math.env import MathEnvironment

__all__ = ["MathEnvironment"]


def __getattr__(name: str) -> Any:
    if name != "MathEnvironment":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from environments.math.env import MathEnvironment

    return MathEnvironment
