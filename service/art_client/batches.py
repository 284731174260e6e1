"""A batch ART's client posts to train on (``POST /v1/preview/training-jobs``): read to disk as it arrives, checked
field by field, and kept beside its job until the job ends.

The body is ``{"model_id", "trajectory_groups", "experimental_config"}`` with the groups as ART dumps them
(``TrajectoryGroup.model_dump(mode="json")``). The API checks that wire format here with models of its own, the
shapes of ART's ``Trajectory`` and ``History`` (the API process imports neither ART nor torch); the worker then builds
ART's objects from it (:func:`trajectory_groups`). Dumped ``Choice``s are recognised by their ``finish_reason`` and
read back as OpenAI's ``Choice``: ART trains on those alone, and ``Trajectory.model_validate`` would leave them
plain dicts.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from service.spec import nul_in

if TYPE_CHECKING:
    import art

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
ART_LEARNING_RATE = 5e-6  # ServerlessBackend.train's default, should a client send none
MetadataValue = float | int | str | bool | None  # ART's


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


def _items(items: list[Any]) -> list[Any]:
    """Messages as dicts with a known role, dumped Choices (they carry ``finish_reason``) as Choices."""
    parsed: list[Any] = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"[{k}]: a message or a Choice object is required")
        if "finish_reason" in item:
            try:
                parsed.append(Choice.model_validate(item))
            except ValidationError as exc:
                raise ValueError(f"[{k}].{_place(exc)}") from None
        elif item.get("role") in ROLES:
            parsed.append(item)
        else:
            raise ValueError(f"[{k}].role: one of {', '.join(sorted(ROLES))} is required")
    return parsed


class _History(BaseModel):
    """ART's ``History``."""

    messages_and_choices: list[Any]
    tools: list[dict[str, Any]] | None = None

    @field_validator("messages_and_choices")
    @classmethod
    def _parsed(cls, items: list[Any]) -> list[Any]:
        return _items(items)


class _Trajectory(_History):
    """ART's ``Trajectory`` as it travels (``start_time`` is not sent)."""

    model_config = ConfigDict(extra="ignore")

    messages_and_choices: list[Any] = Field(min_length=1)
    additional_histories: list[_History] = []
    reward: float
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    metrics: dict[str, float | int | bool] = {}
    metadata: dict[str, MetadataValue] = {}
    logs: list[str] = []

    @field_validator("reward")
    @classmethod
    def _finite(cls, reward: float) -> float:
        if not math.isfinite(reward):
            raise ValueError("a finite number is required")
        return reward


class _Group(BaseModel):
    """ART's ``TrajectoryGroup`` as it travels (its exceptions are the client's own: not trained on)."""

    model_config = ConfigDict(extra="ignore")

    trajectories: list[_Trajectory] = Field(min_length=1)
    metadata: dict[str, MetadataValue] = {}
    metrics: dict[str, float | int | bool] = {}
    logs: list[str] = []


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model_id: str = Field(min_length=1, max_length=36)
    trajectory_groups: list[dict[str, Any]] = Field(min_length=1)
    experimental_config: ExperimentalConfig = ExperimentalConfig()


class Batch(BaseModel):
    """A checked batch: whose model, its groups (the wire format's), and how to train on them."""

    model_id: str
    groups: list[_Group]
    config: ExperimentalConfig

    def trajectory_groups(self) -> list[art.TrajectoryGroup]:
        """The groups as ART's objects (the worker's: it imports ART); BadBatch for what only ART refuses."""
        import art

        try:
            return [
                art.TrajectoryGroup([_art(t) for t in group.trajectories], metadata=group.metadata,
                                    metrics=group.metrics, logs=group.logs)
                for group in self.groups
            ]  # fmt: skip
        except ValidationError as exc:
            raise BadBatch(f"trajectory_groups: {_place(exc)}") from None

    def why_untrainable(self) -> str | None:
        """Why these groups can never train (no reply sampled with logprobs: the script's mistake); None if they can.
        Groups whose rewards are all equal are not refused: they carry no advantage this step, and the step advances
        without a change, as ART's own LocalBackend advances it."""
        if not any(_sampled(t) for g in self.groups for t in g.trajectories):
            return ("nothing to train: no trajectory has an assistant Choice with logprobs (sample through this "
                    "server's chat completions, which return them, and keep the Choice objects in "
                    "messages_and_choices)")
        return None


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
    if (where := nul_in(raw)) is not None:  # the store would refuse it later (PostgreSQL): refused now
        raise BadBatch(f"body: holds a NUL character (\\x00){where}")
    body = _checked(_Body, raw, "")
    groups: list[_Group] = []
    count = 0
    for i, group in enumerate(body.trajectory_groups):
        where = f"trajectory_groups[{i}]."
        trajectories = group.get("trajectories")
        count += len(trajectories) if isinstance(trajectories, list) else 0
        if count > max_trajectories:
            raise BadBatch(f"trajectory_groups: more than {max_trajectories} trajectories in one batch "
                           "(ARTSVC_CLIENT_BATCH_MAX_TRAJECTORIES)")  # fmt: skip
        groups.append(_checked(_Group, group, where))
    return Batch(model_id=body.model_id, groups=groups, config=body.experimental_config)


def _art(trajectory: _Trajectory) -> art.Trajectory:
    """ART's Trajectory, its Choices kept as objects (a dump would make them dicts, which ART does not train on)."""
    import art

    histories = [{"messages_and_choices": history.messages_and_choices, "tools": history.tools}
                 for history in trajectory.additional_histories]  # fmt: skip
    fields = trajectory.model_dump(exclude={"messages_and_choices", "additional_histories"})
    return art.Trajectory.model_validate({**fields, "messages_and_choices": trajectory.messages_and_choices,
                                          "additional_histories": histories})  # fmt: skip


def _sampled(trajectory: _Trajectory) -> bool:
    return any(isinstance(item, Choice) and item.logprobs is not None for item in trajectory.messages_and_choices)


def _checked(model: type[BaseModel], raw: Any, where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadBatch(f"{where}{_place(exc)}") from None


def _place(exc: ValidationError) -> str:
    """The first error as ``place: message``, the place written as the body's path (``a[0].b``)."""
    error = exc.errors()[0]
    place = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    message = error["msg"].removeprefix("Value error, ")
    if message.startswith("["):  # a message list's own place, from _items
        place, message = place + message.split(":", 1)[0], message.split(":", 1)[1].strip()
    return f"{place}: {message}"[:500]
