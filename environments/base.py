"""The environment plugin interface and the registry that finds environments.

An environment is one class registered under the entry-point group ``artsvc.environments``.
The training loop only ever talks to it through :class:`Environment`, reading its members as
plain attributes. Plugins usually subclass :class:`BaseEnvironment`, which supplies the optional
parts (no opening exposed, no demonstrations, no tools, the default base models, fingerprints of
JSONL split files) so that a new environment is a name, its scenarios, a rollout and a verdict.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from importlib.resources.abc import Traversable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing ART (and torch) takes seconds
    import art

ENTRY_POINT_GROUP = "artsvc.environments"
SPLITS = ("train", "val", "test")
DEFAULT_PRETRAINED_MODEL = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Sampling:
    """How a rollout samples from the policy; the loop picks it per step and per split."""

    temperature: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None  # None: the environment's own limit


@runtime_checkable
class Environment(Protocol):
    """What the training loop needs of an environment: every member below, on the instance.

    :func:`load` refuses a class whose instances lack any of them. Subclasses of
    :class:`BaseEnvironment` get a default for every optional member (marked so below), so a new
    environment is a name, its scenarios, a rollout and a verdict.
    """

    name: str
    version: str
    scorer_name: str
    scorer_version: str
    # Optional (BaseEnvironment's defaults in brackets):
    warm_start_examples: int
    """How many demonstrations a policy trained from scratch (the embedded backend) gets as a warm
    start unless the job says otherwise [0]."""
    pretrained_warm_start_examples: int
    """How many demonstrations a pretrained model (the transformers backend) gets before RL unless the
    job says otherwise [0: it starts from its opening, a system prompt and few-shot turns]. Far fewer
    than from scratch: the model has its language, and learns the environment's format and habits."""
    pretrained_job: Mapping[str, Mapping[str, Any]]
    """Training and validation settings a pretrained model's job gets unless it sets them, as
    ``{"training": {...}, "validation": {...}}`` with JobSpec's field names [none: the spec's defaults, sized for
    single-turn math]. An agent's episode is many model calls and a training row of a thousand tokens: its steps
    and validations must be smaller to fit a job on two CPU cores."""
    tools: Sequence[dict[str, Any]]
    """The OpenAI function tools its rollouts offer the policy [none]."""
    embedded_base_model: str | None
    """The embedded architecture whose context holds its conversations [None: the default one]."""
    recommended_base_model: str
    """The pretrained model a pretrained backend starts from [SmolLM2-135M-Instruct]."""

    def scenarios(self, split: str) -> Sequence[dict[str, Any]]:
        """Rows of ``split`` (train, val, test), in a fixed order; each has an ``id``."""

    def fingerprints(self) -> dict[str, str]:
        """sha256 fingerprint of every split, for run manifests."""

    def opening(self, scenario: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The messages a rollout of ``scenario`` starts from, hashed into run manifests so that a
        changed prompt shows [None: not exposed, and a manifest's prompt hash is null]. For a real
        LLM: a system prompt with the contract, then any few-shot turns (see :mod:`environments.prompts`)."""

    async def rollout(self, model: art.Model, scenario: dict[str, Any], sampling: Sampling) -> art.Trajectory:
        """Play ``scenario`` against ``model`` and return the scored trajectory."""

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        """Whether a validation trajectory counts towards validation accuracy."""

    def demonstrations(self, *, seed: int, count: int) -> Iterable[art.Trajectory]:
        """``count`` warm-start trajectories (assistant turns as plain messages), opening as rollouts do [none]; the
        same for the same ``seed``, and best generated as they are read (a warm start streams them) [none]."""


PROTOCOL_MEMBERS = tuple(Environment.__annotations__) + tuple(
    member for member, value in vars(Environment).items() if callable(value) and not member.startswith("_")
)


def new_trajectory(**fields: Any) -> art.Trajectory:
    """``art.Trajectory(**fields)``, importing ART at the first: a process that only checks submissions against the
    environments (the API, a refused ``artsvc train``) never pays the seconds that ART, litellm and torch take."""
    import art

    return art.Trajectory(**fields)


@cache
def read_jsonl(path: Traversable) -> tuple[dict[str, Any], ...]:
    """Rows of a committed JSONL split file, parsed once per process."""
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


@cache
def file_fingerprint(path: Traversable) -> str:
    """The sha256 of a committed data file, read once per process like its rows (``read_jsonl``)."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


class BaseEnvironment:
    """Defaults for the optional parts of :class:`Environment` (documented there).

    Set ``scenario_dir`` (on the class, or per instance) to a folder holding ``train.jsonl``,
    ``val.jsonl`` and ``test.jsonl`` and the splits and their fingerprints come for free: a ``Path``, or
    package data as ``importlib.resources.files("your_package") / "data"`` so that any install finds it.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    scorer_name: ClassVar[str]
    scorer_version: ClassVar[str] = "0.1.0"
    warm_start_examples: int = 0
    pretrained_warm_start_examples: int = 0
    pretrained_job: Mapping[str, Mapping[str, Any]] = MappingProxyType({})
    tools: Sequence[dict[str, Any]] = ()
    embedded_base_model: str | None = None
    recommended_base_model: str = DEFAULT_PRETRAINED_MODEL
    scenario_dir: Traversable | None = None

    def _split_path(self, split: str) -> Traversable:
        if self.scenario_dir is None:
            raise NotImplementedError(f"{type(self).__name__} sets no scenario_dir; override scenarios()")
        if split not in SPLITS:
            raise ValueError(f"{self.name} has no split {split!r}; splits are {', '.join(SPLITS)}")
        return self.scenario_dir / f"{split}.jsonl"

    def scenarios(self, split: str) -> Sequence[dict[str, Any]]:
        return read_jsonl(self._split_path(split))

    def fingerprints(self) -> dict[str, str]:
        return {split: file_fingerprint(self._split_path(split)) for split in SPLITS}

    def opening(self, scenario: dict[str, Any]) -> list[dict[str, Any]] | None:
        return None

    def demonstrations(self, *, seed: int, count: int) -> list[art.Trajectory]:
        return []


class UnknownEnvironmentError(LookupError):
    """No environment of that name is installed."""


class EnvironmentConfigError(ValueError):
    """The arguments given for an environment do not fit its constructor, or the class it names
    does not implement :class:`Environment`."""


@cache
def available() -> dict[str, Any]:
    """Installed environments by name (entry points, not yet loaded), scanned once per process: a scan costs
    milliseconds, and every submission asks. A plugin installed later is seen after a restart."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def arguments_of(cls: type) -> dict[str, Any]:
    """The keyword arguments an environment class takes, with their defaults (None when required)."""
    return {
        p.name: None if p.default is p.empty else p.default
        for p in inspect.signature(cls).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


def load(name: str, args: dict[str, Any] | None = None) -> Environment:
    """An instance of the environment registered as ``name``, built with keyword ``args``.

    Raises UnknownEnvironmentError naming the installed ones, and EnvironmentConfigError for
    arguments the environment does not take or rejects, or for an instance that lacks members of
    :class:`Environment` (named in the message).
    """
    found = available()
    if name not in found:
        installed = ", ".join(sorted(found)) or "none (is the package installed with pip install -e .?)"
        raise UnknownEnvironmentError(f"unknown environment {name!r}; installed: {installed}")
    cls = found[name].load()
    args = dict(args or {})
    accepted = arguments_of(cls)
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        takes = ", ".join(sorted(accepted)) or "no arguments"
        raise EnvironmentConfigError(f"environment {name!r} takes {takes}; got unknown {', '.join(unknown)}")
    try:
        env = cls(**args)
    except (TypeError, ValueError) as exc:
        raise EnvironmentConfigError(f"environment {name!r}: {exc}") from exc
    missing = [member for member in PROTOCOL_MEMBERS if not hasattr(env, member)]
    if missing:
        raise EnvironmentConfigError(
            f"environment {name!r} ({cls.__module__}.{cls.__qualname__}) does not implement the Environment "
            f"protocol: missing {', '.join(missing)} (subclass environments.BaseEnvironment for the optional ones)"
        )
    return env
