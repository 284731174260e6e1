"""Integer arithmetic with a strict ``Final: <int>`` answer format.

The package exports its environment class only; the scorer, the levels and the generator are imported from their
modules. The class loads on first use, so that ``python -m environments.math.scenarios`` (which regenerates the
data) runs without importing ART.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from environments.lazy import export

if TYPE_CHECKING:
    from environments.math.env import MathEnvironment

__all__ = ["MathEnvironment"]
__getattr__ = export(__name__, "MathEnvironment", "environments.math.env")
