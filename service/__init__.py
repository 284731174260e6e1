"""artsvc: train agents with reinforcement learning through OpenPipe ART."""

__version__ = "0.1.0"
