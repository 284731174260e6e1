"""The ART models a job's backend serves: the one a training job trains, and one of its checkpoints as a plain
model to sample from (an evaluation's)."""

from __future__ import annotations

from pathlib import Path

import art

from environments.base import Environment
from service import manifests
from service.backends import layout
from service.spec import JobSpec


def trainable_model(job_id: str, spec: JobSpec, env: Environment, data_dir: Path) -> art.TrainableModel:
    """The ART model a job trains: one per job, so concurrent jobs never share checkpoints."""
    return art.TrainableModel(
        name=layout.job_model_name(job_id, spec.model.name),
        project=layout.PROJECT,
        base_model=manifests.base_model_for(spec, env),
        base_path=str(data_dir / "art"),
    )


def checkpoint_model(trainable: art.TrainableModel, step: int) -> art.Model:
    """``trainable`` at checkpoint ``step``, served by the backend it is registered with."""
    return art.Model(name=trainable.name, project=trainable.project, inference_model_name=trainable.get_inference_name(step),
                     inference_base_url=trainable.inference_base_url, inference_api_key=trainable.inference_api_key)  # fmt: skip
