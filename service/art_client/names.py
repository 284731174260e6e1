"""The names ART's client gives a model to sample from: ``wandb-artifact:///{entity}/{project}/{name}``, the newest
checkpoint, or ``...:step{N}``, one step's (ART's ``ServerlessBackend._model_inference_name``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "wandb-artifact:///"
PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # an entity, a project or a model name
_STEP = re.compile(r"^step(\d{1,9})$")


@dataclass(frozen=True)
class ArtifactName:
    entity: str
    project: str
    name: str
    step: int | None  # None: the newest checkpoint


def is_artifact_name(model: str) -> bool:
    return model.startswith(PREFIX)


def parse(model: str) -> ArtifactName | None:
    """The parts of an artifact name, or None if ``model`` is not one this server could have given out."""
    if not model.startswith(PREFIX):
        return None
    path, colon, version = model[len(PREFIX):].partition(":")
    parts = path.split("/")
    if len(parts) != 3 or not all(PART.fullmatch(part) for part in parts):
        return None
    step = None
    if colon:
        if (match := _STEP.fullmatch(version)) is None:
            return None
        step = int(match.group(1))
    return ArtifactName(*parts, step=step)


def artifact_name(entity: str, project: str, name: str, step: int | None = None) -> str:
    return f"{PREFIX}{entity}/{project}/{name}" + (f":step{step}" if step is not None else "")
