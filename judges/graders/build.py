"""From a JSON config to a Grader: one pydantic union on ``type`` validates every kind, nested ones included."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from judges.graders.base import Grader, GraderConfigError
from judges.graders.multi import MultiConfig, MultiGrader
from judges.graders.python import PythonConfig, PythonGrader
from judges.graders.score_model import ScoreModelConfig, ScoreModelGrader
from judges.graders.string_check import StringCheckConfig, StringCheckGrader
from judges.graders.text_similarity import TextSimilarityConfig, TextSimilarityGrader

GraderConfig = Annotated[
    StringCheckConfig | TextSimilarityConfig | PythonConfig | ScoreModelConfig | MultiConfig,
    Field(discriminator="type"),
]
MultiConfig.model_rebuild(_types_namespace={"GraderConfig": GraderConfig})  # multi's parts are any grader config
KINDS = ("string_check", "text_similarity", "python", "score_model", "multi")
_CONFIG = TypeAdapter(GraderConfig)


def build_grader(
    config: dict, *, allowed_models: AbstractSet[str] | None = None, litellm_params: dict[str, Any] | None = None
) -> Grader:
    """A grader for ``config``. ``allowed_models`` (None: any) bounds the models a score_model may name;
    ``litellm_params`` (api_base, api_key, timeout...) go to every model call. Raises GraderConfigError, naming the
    field, for an invalid config."""
    try:
        parsed = _CONFIG.validate_python(config, context={"allowed_models": allowed_models})
    except ValidationError as exc:
        raise GraderConfigError("; ".join(_explain(error) for error in exc.errors())) from None
    return _grader(parsed, dict(litellm_params or {}))


def _grader(config: Any, litellm_params: dict[str, Any]) -> Grader:
    if isinstance(config, MultiConfig):
        return MultiGrader(config, {name: _grader(part, litellm_params) for name, part in config.graders.items()})
    if isinstance(config, ScoreModelConfig):
        return ScoreModelGrader(config, litellm_params)
    if isinstance(config, PythonConfig):
        return PythonGrader(config)
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
