"""From a JSON config to a Grader: one pydantic union on ``type`` validates every kind, nested ones included.

The tree's size is checked first, on the raw JSON (limits.py), so a deep or wide tree is refused before pydantic
recurses into it.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from pydantic import TypeAdapter, ValidationError

from judges.graders.base import Grader, GraderConfigError
from judges.graders.limits import tree_problem
from judges.graders.multi import GraderConfig, MultiConfig, MultiGrader
from judges.graders.python import PythonConfig, PythonGrader
from judges.graders.registry import CodeGraders, GraderRegistry
from judges.graders.score_model import ScoreModelConfig, ScoreModelGrader
from judges.graders.string_check import StringCheckGrader
from judges.graders.text_similarity import TextSimilarityConfig, TextSimilarityGrader

KINDS = ("string_check", "text_similarity", "python", "score_model", "multi")
_CONFIG = TypeAdapter(GraderConfig)


def check_grader(
    config: Any, *, allowed_models: AbstractSet[str] | None = None, registry: GraderRegistry | None = None
) -> Any:
    """``config`` parsed. ``allowed_models`` (None: any) bounds the models a score_model may name, ``registry``
    (None: any well-formed name, the shape only) the functions a python grader may name. Imports nothing a config
    names. Raises GraderConfigError, naming the field or the limit, for an invalid config."""
    if (problem := tree_problem(config)) is not None:
        raise GraderConfigError(problem)
    try:
        return _CONFIG.validate_python(config, context={"allowed_models": allowed_models, "registry": registry})
    except ValidationError as exc:
        raise GraderConfigError("; ".join(_explain(error) for error in exc.errors())) from None


def build_grader(
    config: dict,
    *,
    allowed_models: AbstractSet[str] | None = None,
    code: CodeGraders | None = None,
    litellm_params: dict[str, Any] | None = None,
) -> Grader:
    """A grader for ``config``, checked as by ``check_grader``. ``code`` (None: no python grader may run) is the
    operator's registry of code graders and their limits; ``litellm_params`` (api_base, api_key, timeout...) go to
    every model call."""
    code = code or CodeGraders()
    parsed = check_grader(config, allowed_models=allowed_models, registry=code.registry)
    return _grader(parsed, code, dict(litellm_params or {}))


def _grader(config: Any, code: CodeGraders, litellm_params: dict[str, Any]) -> Grader:
    if isinstance(config, MultiConfig):
        parts = {name: _grader(part, code, litellm_params) for name, part in config.graders.items()}
        return MultiGrader(config, parts)
    if isinstance(config, ScoreModelConfig):
        return ScoreModelGrader(config, litellm_params)
    if isinstance(config, PythonConfig):
        return PythonGrader(config, code)
    if isinstance(config, TextSimilarityConfig):
        return TextSimilarityGrader(config)
    return StringCheckGrader(config)


def _explain(error: dict) -> str:
    """``graders.exact.operation: Input should be ...``: pydantic's location without the union's tags."""
    loc = error["loc"]
    path = [str(part) for i, part in enumerate(loc)
            if not (part in KINDS and (i == 0 or (i >= 2 and loc[i - 2] == "graders")))]  # fmt: skip
    if error["type"].startswith("union_tag"):
        path.append("type")
    message = error["msg"].removeprefix("Value error, ")
    return f"{'.'.join(path) or 'config'}: {message}"
