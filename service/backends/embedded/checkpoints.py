"""On-disk state of one embedded model: a checkpoint per step plus the KL reference.

Layout under the model directory::

    checkpoints/0000.pt   policy weights, optimizer state and config at step 0
    checkpoints/0001.pt   ... one file per training step
    reference.pt          the warm-start policy, the anchor of the KL penalty

Files are written to a temporary name and renamed, so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from service.backends.embedded.policy import CharGPT, PolicyConfig

_CHECKPOINT = re.compile(r"^(\d{4,})\.pt$")


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class CheckpointStore:
    """Reads and writes the checkpoints of one model directory."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.checkpoint_dir = model_dir / "checkpoints"
        self.reference_path = model_dir / "reference.pt"

    def path(self, step: int) -> Path:
        return self.checkpoint_dir / f"{step:04d}.pt"

    def steps(self) -> list[int]:
        if not self.checkpoint_dir.exists():
            return []
        return sorted(int(m[1]) for p in self.checkpoint_dir.iterdir() if (m := _CHECKPOINT.match(p.name)))

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, policy: CharGPT, optimizer: torch.optim.Optimizer | None) -> None:
        _atomic_save(
            {
                "step": step,
                "config": policy.config.to_dict(),
                "policy": policy.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
            },
            self.path(step),
        )

    def load(self, step: int) -> dict[str, Any]:
        path = self.path(step)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint for step {step} at {path}")
        return torch.load(path, weights_only=True)

    def load_policy(self, step: int) -> CharGPT:
        state = self.load(step)
        policy = CharGPT(PolicyConfig(**state["config"]))
        policy.load_state_dict(state["policy"])
        return policy.eval()

    def save_reference(self, policy: CharGPT) -> None:
        _atomic_save({"config": policy.config.to_dict(), "policy": policy.state_dict()}, self.reference_path)

    def load_reference(self) -> CharGPT | None:
        if not self.reference_path.exists():
            return None
        state = torch.load(self.reference_path, weights_only=True)
        policy = CharGPT(PolicyConfig(**state["config"]))
        policy.load_state_dict(state["policy"])
        return policy.eval()

    def delete_except(self, steps_to_keep: list[int]) -> None:
        for step in self.steps():
            if step not in steps_to_keep:
                self.path(step).unlink()
