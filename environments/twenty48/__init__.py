"""2048 as a multi-turn game: reach a target tile one ``<move>DIRECTION</move>`` reply at a time.

The package exports its environment class only; the engine, the rendering and the scoring are plain Python imported
from their modules (``from environments.twenty48.engine import slide``). The class loads on first use, so that they
and ``python -m environments.twenty48.scenarios`` (which regenerates the data) run without importing ART.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from environments.lazy import export

if TYPE_CHECKING:
    from environments.twenty48.env import Twenty48Environment

__all__ = ["Twenty48Environment"]
__getattr__ = export(__name__, "Twenty48Environment", "environments.twenty48.env")
