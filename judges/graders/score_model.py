"""``score_model``: a model reads the rendered messages and answers with a number in ``range``, as OpenAI's grader.

The messages are the config's, rendered, after one system line asking for a bare number in the range. The score is
``{"score": x}`` if the reply is that JSON object, else the first number in it; a score outside the range is clamped
(details keep the raw value), then mapped onto [0, 1] as (x - lo) / (hi - lo). A failed call (an HTTP error, a
timeout) or a reply without a number is an error result, never a low score. Which models may be named, and the
endpoint and key they are reached with, are the operator's (``build_grader``'s ``allowed_models`` and
``litellm_params``), never the client's.
"""

from __future__ import annotations

import json
import math
import re
from importlib.resources import files
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from judges.graders import templates
from judges.graders.base import Grader, GradeResult, GraderModel, StrictModel, clamp, describe, finite_number, snippet
from judges.graders.templates import Template

VERSION = "score_model-1.0.0"  # bump when the instruction, the parsing or the mapping changes

# The system line before the config's messages: score_model.txt beside this module (package data).
INSTRUCTION = files("judges.graders").joinpath("score_model.txt").read_text(encoding="utf-8").removesuffix("\n")
NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")  # ASCII digits only
MAX_REPLY_CHARS = 500  # of the reply, kept in details
DEFAULT_TIMEOUT_S = 60.0  # for each call, unless the operator's litellm_params say otherwise

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class Message(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: Template


class SamplingParams(StrictModel):
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)


class ScoreModelConfig(GraderModel):
    type: Literal["score_model"]
    model: str = Field(min_length=1, max_length=256, description="a litellm model name, e.g. 'openai/gpt-4o-mini'")
    input: list[Message] = Field(min_length=1, max_length=16)
    range: tuple[FiniteFloat, FiniteFloat] = (0.0, 1.0)
    sampling_params: SamplingParams | None = None

    @field_validator("model")
    @classmethod
    def _model_is_allowed(cls, model: str, info: ValidationInfo) -> str:
        allowed = (info.context or {}).get("allowed_models")
        if allowed is not None and model not in allowed:
            shown = ", ".join(sorted(allowed)) or "none"
            raise ValueError(f"model {model!r} is not allowed here (allowed: {shown}; the operator sets "
                             "ARTSVC_JUDGE_MODELS)")  # fmt: skip
        return model

    @field_validator("range")
    @classmethod
    def _range_is_ordered(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        lo, hi = bounds
        if not (lo < hi and math.isfinite(hi - lo)):
            raise ValueError(f"[{lo:g}, {hi:g}] must have lo < hi, and a finite width")
        return bounds


class ScoreModelGrader(Grader):
    """The model's score for the sample, mapped from ``range`` onto [0, 1]; tokens and cost in details."""

    def __init__(self, config: ScoreModelConfig, litellm_params: dict[str, Any]) -> None:
        super().__init__(config.name, VERSION)
        self.config = config
        self.litellm_params = {"timeout": DEFAULT_TIMEOUT_S, **litellm_params}

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        lo, hi = self.config.range
        try:
            messages = [{"role": m.role, "content": templates.render(m.content, sample=sample, item=item)}
                        for m in self.config.input]  # fmt: skip
        except templates.TemplateError as exc:
            return self.error(str(exc))
        messages.insert(0, {"role": "system", "content": INSTRUCTION.format(lo=f"{lo:g}", hi=f"{hi:g}")})
        sampling = self.config.sampling_params.model_dump(exclude_none=True) if self.config.sampling_params else {}
        model = self.config.model
        import litellm  # seconds to import: paid by the first model-graded sample, not by every import of graders

        from judges.usage import response_cost

        try:
            call = {
                **self.litellm_params,
                **sampling,
                "model": model,
                "messages": messages,
            }  # the config's sampling wins
            response = await litellm.acompletion(**call)
        except Exception as exc:  # noqa: BLE001 -- any failed call (HTTP, timeout, auth) is an error result
            return self.error(f"the call to {model} failed: {describe(exc)}", model=model)
        usage = getattr(response, "usage", None)
        details: dict[str, Any] = {
            "model": model,
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
            "cost_usd": response_cost(response, model),  # None when litellm has no price for the model
        }
        content = response.choices[0].message.content
        reply = content if isinstance(content, str) else ""  # None when the model refused or called a tool
        details["reply"] = reply[:MAX_REPLY_CHARS]
        raw = parse_score(reply)
        if raw is None:
            return self.error(f"no finite score in the reply {snippet(reply)}", **details)
        score = clamp(raw, lo, hi)
        details["raw_score"] = raw
        reason = f"{model} scored {raw:g} in [{lo:g}, {hi:g}]"
        if score != raw:
            details["clamped"] = True
            reason = f"{model} scored {raw:g}, outside [{lo:g}, {hi:g}]: clamped to {score:g}"
        return self.result((score - lo) / (hi - lo), reason, **details)


def parse_score(reply: str) -> float | None:
    """The "score" of a JSON object reply, else the first number in the reply; None if it is missing or not finite."""
    try:
        parsed = json.loads(reply)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return finite_number(parsed.get("score"))
    match = NUMBER.search(reply)
    return finite_number(float(match.group())) if match else None
