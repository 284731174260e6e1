"""What a chat completion on an ART name serves (``wandb-artifact:///{entity}/{project}/{name}[:step{N}]``): the
caller's model of that name at its newest checkpoint or the one named, or its base model before the first training
job (step 0, the checkpoint a fresh LoRA adapter would be: the base itself)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.art_client import names, registry
from service.auth import Principal
from service.backends import layout
from service.backends.openai_server import ServingError


@dataclass(frozen=True)
class Served:
    """What answers: ``folder``'s adapter on its base, or ``base_model`` alone when ``folder`` is None."""

    name: str  # the response's ``model``: the artifact name with its step
    folder: Path | None
    base_model: str


def find(store: Engine, *, caller: Principal, data_dir: Path, model: str) -> Served:
    """The checkpoint ``model`` names among the caller's models; ServingError 404 if there is none."""
    parsed = names.parse(model)
    if parsed is None:
        raise ServingError(404, f"model {model[:300]!r} does not exist", "model_not_found")
    with Session(store) as session:
        found = registry.find(session, owner_id=caller.id, entity=parsed.entity, project=parsed.project,
                              name=parsed.name)  # fmt: skip
        if found is None:
            raise ServingError(404, f"model {model!r} does not exist", "model_not_found")
        steps = registry.checkpoint_steps(session, found, data_dir)
        folder = registry.model_dir(registry.series_job(session, found), data_dir)
    step = parsed.step if parsed.step is not None else (steps[-1] if steps else 0)
    name = names.artifact_name(parsed.entity, parsed.project, parsed.name, step)
    if step in steps:
        return Served(name, layout.checkpoint_dir(folder, step), found.base_model)
    if step == 0 and not steps:
        return Served(name, None, found.base_model)
    raise ServingError(404, f"model {model!r}: no checkpoint at step {step}", "model_not_found")
