"""Where a job's model lives on disk, shared by the backends that write it and the API that reads it.

ART's layout: ``<data_dir>/models/<project>/models/<model name>/checkpoints/<step:04d>``. The transformers
backend writes each step as a PEFT adapter directory there; the embedded backend as a ``.pt`` file.
"""

from __future__ import annotations

import re
from pathlib import Path

PROJECT = "artsvc"
_STEP = re.compile(r"^(\d{4,})(\.pt)?$")


def job_model_name(job_id: str, model_name: str) -> str:
    """The ART model a job trains: one per job, so concurrent jobs never share checkpoints."""
    return f"{model_name}-{job_id[:8]}"


def models_root(data_dir: Path) -> Path:
    """What backends get as their ``path``."""
    return data_dir / "models"


def model_dir(root: Path, name: str, project: str = PROJECT) -> Path:
    return root / project / "models" / name


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    """A step's PEFT adapter directory (the transformers backend's checkpoint)."""
    return model_dir / "checkpoints" / f"{step:04d}"


def reference_dir(model_dir: Path) -> Path:
    """The transformers backend's KL reference adapter: the warm start, kept apart from the steps' checkpoints."""
    return model_dir / "reference"


def checkpoint_steps(model_dir: Path) -> list[int]:
    """Steps with a finished checkpoint, oldest first (a directory or an embedded ``.pt`` file)."""
    folder = model_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP.match(p.name)))
