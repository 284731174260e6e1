"""A batch ART's client posts to train on (``POST /v1/preview/training-jobs``): read to disk as it arrives, checked
field by field, and kept beside its job until the job ends.

The body is ``{"model_id", "trajectory_groups", "experimental_config"}`` with the groups as ART dumps them
(``TrajectoryGroup.model_dump(mode="json")``). Dumped ``Choice``s are recognised by their ``finish_reason`` and read
back as ``Choice``s: ART trains on those alone, and ``Trajectory.model_validate`` would leave them plain dicts.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import art
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
ART_LEARNING_RATE = 5e-6  # ServerlessBackend.train's default, should a client send none


class BadBatch(ValueError):
    """The first thing wrong with a posted batch, named by its place in the body (a 422)."""


class ExperimentalConfig(BaseModel):
    """ART's ``ExperimentalTrainingConfig``, bounded. Unknown keys (a newer client's) are ignored."""

    model_config = ConfigDict(extra="ignore")

    learning_rate: float | None = Field(None, gt=0, le=1)
    advantage_balance: float | None = Field(None, ge=-1, le=1)
    epsilon: float | None = Field(None, gt=0, le=100)
    epsilon_high: float | None = Field(None, gt=0, le=100)
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"] | None = None
    kimi_k2_tau: float | None = Field(None, gt=0, le=1000)
    mask_prob_ratio: bool | None = None
    max_negative_advantage_importance_sampling_weight: float | None = Field(None, gt=0, le=1e6)
    ppo: bool | None = None
    precalculate_logprobs: bool | None = None
    scale_rewards: bool | None = None

    def train_options(self) -> dict[str, Any]:
        """The keyword arguments of ``backend.train`` it stands for (ART's defaults where unset)."""
        given = self.model_dump(exclude_none=True, exclude={"learning_rate", "precalculate_logprobs"})
        return {**given, "learning_rate": self.learning_rate or ART_LEARNING_RATE,
                "scale_rewards": True if self.scale_rewards is None else self.scale_rewards}  # fmt: skip


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_id: str = Field(min_length=1, max_length=36)
    trajectory_groups: list[dict[str, Any]] = Field(min_length=1)
    experimental_config: ExperimentalConfig = ExperimentalConfig()


class _Group(BaseModel):
    model_config = ConfigDict(extra="ignore")

    trajectories: list[dict[str, Any]] = Field(min_length=1)
    metadata: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    logs: list[str] = []


class Batch(BaseModel):
    """A checked batch: whose model, its groups, and how to train on them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_id: str
    groups: list[art.TrajectoryGroup]
    config: ExperimentalConfig


def folder(data_dir: Path) -> Path:
    return data_dir / "client-batches"


def path_of(data_dir: Path, job_id: str) -> Path:
    """Where the batch of job ``job_id`` waits for its run (the id is the server's own uuid)."""
    return folder(data_dir) / f"{job_id}.json"


async def receive(chunks: AsyncIterator[bytes], data_dir: Path) -> Path:
    """The body, as it arrives, in a new file of ``folder(data_dir)``: never whole in memory (the API's body limit
    bounds it)."""
    target = folder(data_dir)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f".incoming-{uuid.uuid4()}.json"
    try:
        with open(path, "wb") as file:
            async for chunk in chunks:
                file.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def keep(incoming: Path, data_dir: Path, job_id: str) -> Path:
    """The received body, renamed to be job ``job_id``'s batch."""
    kept = path_of(data_dir, job_id)
    os.replace(incoming, kept)
    return kept


def read(path: Path, *, max_trajectories: int) -> Batch:
    """The batch in ``path``, checked; BadBatch naming the first bad field."""
    try:
        with open(path, "rb") as file:
            raw = json.load(file)
    except (ValueError, RecursionError) as exc:
        raise BadBatch(f"body: not JSON ({str(exc)[:200]})") from None
    body = _checked(_Body, raw, "")
    groups: list[art.TrajectoryGroup] = []
    count = 0
    for i, group in enumerate(body.trajectory_groups):
        where = f"trajectory_groups[{i}]"
        posted = _checked(_Group, group, where + ".")
        count += len(posted.trajectories)
        if count > max_trajectories:
            raise BadBatch(f"trajectory_groups: more than {max_trajectories} trajectories in one batch "
                           "(ARTSVC_CLIENT_BATCH_MAX_TRAJECTORIES)")  # fmt: skip
        trajectories = [_trajectory(t, f"{where}.trajectories[{j}]") for j, t in enumerate(posted.trajectories)]
        try:
            groups.append(art.TrajectoryGroup(trajectories, metadata=posted.metadata, metrics=posted.metrics,
                                              logs=posted.logs))  # fmt: skip
        except ValidationError as exc:
            raise BadBatch(_first_error(exc, where + ".")) from None
    return Batch(model_id=body.model_id, groups=groups, config=body.experimental_config)


def why_untrainable(groups: list[art.TrajectoryGroup]) -> str | None:
    """Why ``groups`` can never train (no reply sampled with logprobs: the script's mistake); None if they can. Groups
    whose rewards are all equal are not refused: they carry no advantage this step, and the step advances without a
    change, as ART's own LocalBackend advances it."""
    if not any(_sampled_with_logprobs(t) for g in groups for t in g.trajectories):
        return ("nothing to train: no trajectory has an assistant Choice with logprobs (sample through this "
                "server's chat completions, which return them, and keep the Choice objects in messages_and_choices)")
    return None


def _sampled_with_logprobs(trajectory: art.Trajectory) -> bool:
    return any(isinstance(item, Choice) and item.logprobs is not None for item in trajectory.messages_and_choices)


def _trajectory(raw: dict[str, Any], where: str) -> art.Trajectory:
    items = raw.get("messages_and_choices")
    if not isinstance(items, list) or not items:
        raise BadBatch(f"{where}.messages_and_choices: a non-empty list is required")
    histories = raw.get("additional_histories") or []
    if not isinstance(histories, list):
        raise BadBatch(f"{where}.additional_histories: a list is required")
    histories = [_history(h, f"{where}.additional_histories[{k}]") for k, h in enumerate(histories)]
    parsed = {**raw, "messages_and_choices": _items(items, f"{where}.messages_and_choices"),
              "additional_histories": histories}
    try:
        return art.Trajectory.model_validate(parsed)
    except ValidationError as exc:
        raise BadBatch(_first_error(exc, where + ".")) from None


def _history(raw: Any, where: str) -> Any:
    if not isinstance(raw, dict) or not isinstance(raw.get("messages_and_choices"), list):
        raise BadBatch(f"{where}.messages_and_choices: a list is required")
    return {**raw, "messages_and_choices": _items(raw["messages_and_choices"], f"{where}.messages_and_choices")}


def _items(items: list[Any], where: str) -> list[Any]:
    """Messages as dicts with a known role, dumped Choices (they carry ``finish_reason``) as Choices."""
    parsed: list[Any] = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadBatch(f"{where}[{k}]: a message or a Choice object is required")
        if "finish_reason" in item:
            try:
                parsed.append(Choice.model_validate(item))
            except ValidationError as exc:
                raise BadBatch(_first_error(exc, f"{where}[{k}].")) from None
        elif item.get("role") in ROLES:
            parsed.append(item)
        else:
            raise BadBatch(f"{where}[{k}].role: one of {', '.join(sorted(ROLES))} is required")
    return parsed


def _checked(model: type[BaseModel], raw: Any, where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadBatch(_first_error(exc, where)) from None


def _first_error(exc: ValidationError, where: str) -> str:
    error = exc.errors()[0]
    place = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    return f"{where}{place}: {error['msg']}".rstrip(". ")[:500] if place or where else error["msg"][:500]
