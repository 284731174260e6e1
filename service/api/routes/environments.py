"""The installed environments, with what makes two runs comparable: versions, split sizes and fingerprints."""

from __future__ import annotations

import logging
from functools import lru_cache

from fastapi import APIRouter, Depends

import environments
from service.api.deps import get_caller
from service.api.watch_schemas import EnvironmentPublic, SplitPublic

router = APIRouter(prefix="/v1", tags=["environments"])
logger = logging.getLogger(__name__)


@router.get("/environments", dependencies=[Depends(get_caller)])
def list_environments() -> list[EnvironmentPublic]:
    """Every installed environment by name; one that fails to load is listed with its `error`."""
    return list(catalog())


@lru_cache(maxsize=1)
def catalog() -> tuple[EnvironmentPublic, ...]:
    """Each installed environment described, loaded once a process (splits can be tens of thousands of rows)."""
    return tuple(describe(name) for name in sorted(environments.available()))


def describe(name: str) -> EnvironmentPublic:
    """``name``'s versions and splits; a plugin that raises is described by its error instead."""
    try:
        env = environments.load(name)
        fingerprints = env.fingerprints()
        splits = {
            split: SplitPublic(size=len(env.scenarios(split)), fingerprint=fingerprint)
            for split, fingerprint in fingerprints.items()
            if split in environments.SPLITS
        }
        data = {key: value for key, value in fingerprints.items() if key not in environments.SPLITS}
        versions = dict(version=env.version, scorer_name=env.scorer_name, scorer_version=env.scorer_version)
        return EnvironmentPublic(
            name=name,
            splits=splits,
            data_fingerprints=data,
            arguments=environments.arguments_of(type(env)),
            tools=[tool["function"]["name"] for tool in env.tools],
            warm_start_examples=env.warm_start_examples,
            pretrained_warm_start_examples=env.pretrained_warm_start_examples,
            pretrained_job={section: dict(fields) for section, fields in env.pretrained_job.items()},
            **versions,
        )
    except Exception as exc:  # a broken plugin must not take the listing down
        logger.exception("environment %r failed to load", name)
        return EnvironmentPublic(name=name, error=f"failed to load: {type(exc).__name__}: {exc}"[:500])
