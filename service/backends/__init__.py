"""Backends by name: the embedded CPU backend, or ART's GPU (``local``) and ``serverless`` ones."""

from __future__ import annotations

import os
from pathlib import Path

import art

from service.backends.embedded import EmbeddedBackend


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (missing extras or credentials)."""


def make_backend(name: str, *, data_dir: Path, seed: int) -> art.Backend:
    """A fresh backend instance; the caller closes it."""
    if name == "embedded":
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
        return art.ServerlessBackend()
    raise BackendUnavailableError(f"unknown backend {name!r}")
