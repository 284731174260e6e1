"""The embedded CPU backend: a small character-level policy trained with SFT and GRPO."""

from service.backends.embedded.backend import EmbeddedBackend

__all__ = ["EmbeddedBackend"]
