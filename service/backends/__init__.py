"""Backends by name: ``transformers`` (a real LM, CUDA or CPU), the ``embedded`` character policy, or ART's GPU
(``local``) and ``serverless`` ones.

Importing this package loads neither ART nor torch (a backend's own imports happen when it is made), so the API can
read :mod:`service.backends.layout` without them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from service.gc_frozen import collector_paused

if TYPE_CHECKING:
    import art

    from service.backends.transformers.precision import Precision


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (missing extras or credentials)."""


def make_backend(
    name: str, *, data_dir: Path, seed: int, precision: Precision = "auto", max_sequence_tokens: int | None = None,
    activation_memory_gib: float | None = None,
) -> art.Backend:
    """A fresh backend instance; the caller closes it. ``precision`` is the transformers backend's base dtype
    (``Settings.precision``), ``max_sequence_tokens`` the longest trajectory it trains (None: any),
    ``activation_memory_gib`` what a training pass may keep of its activations (``Settings.activation_memory_gib``)."""
    if name == "transformers":
        with collector_paused():  # the first call imports torch and transformers (gc_frozen.py)
            from service.backends.transformers.backend import TransformersBackend
            from service.backends.transformers.engine import LoraSettings

        memory = None if activation_memory_gib is None else int(activation_memory_gib * 2**30)
        return TransformersBackend(path=data_dir / "models", cache_dir=data_dir / "cache", seed=seed,
                                   precision=precision, max_sequence_tokens=max_sequence_tokens,
                                   lora=LoraSettings(activation_memory=memory))  # fmt: skip
    if name == "embedded":
        from service.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(path=data_dir / "models", cache_dir=data_dir / "cache", seed=seed)
    if name == "local":
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailableError("the local backend trains on a CUDA GPU and this machine has none")
        try:
            from art.local import LocalBackend
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the local backend needs ART's GPU extras (pip install 'openpipe-art[backend]') on a CUDA machine: {exc}"
            ) from None
        return LocalBackend(path=str(data_dir / "art-local"))
    if name == "serverless":
        if not os.environ.get("WANDB_API_KEY"):
            raise BackendUnavailableError("the serverless backend needs WANDB_API_KEY in the environment")
        import art

        return art.ServerlessBackend()
    raise BackendUnavailableError(f"unknown backend {name!r}")


def precision_of(backend: art.Backend) -> str | None:
    """The dtype name the backend computes its policy's base model in, where this process chose it (the transformers
    backend); None where it is not this process's to choose (ART's GPU and serverless backends) or never varies."""
    return getattr(backend, "precision", None)
