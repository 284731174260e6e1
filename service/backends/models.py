"""The ART models a job's backend serves: the one a training job trains, and one of its checkpoints as a plain
model to sample from (an evaluation's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import art

from environments.base import Environment
from service import manifests
from service.backends import layout
from service.spec import JobSpec

if TYPE_CHECKING:
    from openai import AsyncOpenAI


class TrainableModel(art.TrainableModel):
    """ART's trainable model, whose client reaches a policy server in this process without a connection.

    ``openai_client()`` is ART's client (its cost hooks, its default request body) with, where the backend serves in
    this process, that server's direct HTTP client (``LoopbackServing.direct_http_client``): a rollout's requests
    are answered by the same app, in the rollout's own task. Other backends are reached as ART reaches them."""

    _direct_client: Any = None

    def openai_client(self) -> AsyncOpenAI:
        if self._direct_client is not None:
            return self._direct_client
        client = super().openai_client()
        direct = getattr(self.backend(), "direct_http_client", None)
        http = direct() if direct is not None else None
        if http is None:
            return client
        self._direct_client = client.with_options(http_client=http)
        return self._direct_client


def trainable_model(job_id: str, spec: JobSpec, env: Environment, data_dir: Path) -> art.TrainableModel:
    """The ART model a job trains: one per job, so concurrent jobs never share checkpoints."""
    return TrainableModel(
        name=layout.job_model_name(job_id, spec.model.name),
        project=layout.PROJECT,
        base_model=manifests.base_model_for(spec, env),
        base_path=str(data_dir / "art"),
    )


class CheckpointModel(art.Model):
    """A checkpoint of a trainable model as a plain model to sample from, through the trainable's own client (which
    needs no connection where the backend serves in this process); the checkpoint is named in each request."""

    _trainable: Any = None

    def openai_client(self) -> AsyncOpenAI:
        return self._trainable.openai_client() if self._trainable is not None else super().openai_client()


def checkpoint_model(trainable: art.TrainableModel, step: int) -> art.Model:
    """``trainable`` at checkpoint ``step``, served by the backend it is registered with."""
    model = CheckpointModel(
        name=trainable.name, project=trainable.project, inference_model_name=trainable.get_inference_name(step),
        inference_base_url=trainable.inference_base_url, inference_api_key=trainable.inference_api_key,
    )  # fmt: skip
    model._trainable = trainable
    return model
