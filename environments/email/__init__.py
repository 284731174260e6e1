"""Email search with tools, in the manner of OpenPipe's ART-E: find a fact in an inbox and cite it.

The package exports its environment class only; the parts (search, tools, agents, verifier) are imported from their
modules. The class loads on first use, so that ``python -m environments.email.corpus`` (which regenerates the data)
runs without importing ART.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from environments.lazy import export

if TYPE_CHECKING:
    from environments.email.env import EmailEnvironment

__all__ = ["EmailEnvironment"]
__getattr__ = export(__name__, "EmailEnvironment", "environments.email.env")
