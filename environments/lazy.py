"""An environment package's one export, loaded on first use (PEP 562 ``__getattr__``): the package's plain-Python
parts (scorers, engines, the offline data generators) import without pulling in ART through the class's module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def export(package: str, name: str, module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``name`` comes from ``module`` when first asked for, nothing else exists."""

    def __getattr__(attribute: str) -> Any:
        if attribute != name:
            raise AttributeError(f"module {package!r} has no attribute {attribute!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
