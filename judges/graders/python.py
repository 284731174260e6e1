"""``python``: a reward function the operator registered (registry.py), run in its own process (sandbox.py).

The client names a registered function, by its entry-point name or as ``"package.module:function"``; it never sends
source, and a name that is not registered is a config error, found without importing anything. At grade time the
name is checked again against the registry the grader was built with, and only its registered target runs: in a
fresh interpreter with a timeout (which counts the interpreter's start, about 50 ms, and the module's import), an
address-space limit and no inherited secrets. sample and item reach it as JSON.

The function is called as ``f(sample, item)`` and returns a number or ``{"reward": number, "details": {...}}``. A
non-number, a non-finite number, an exception, a crash, running out of memory or a timeout is an error result; a
finite number outside [0, 1] is clamped, and details say so and keep the raw value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from judges.graders import sandbox
from judges.graders.base import Grader, GradeResult, GraderModel, clamp, finite_number, shown
from judges.graders.registry import CodeGraders, GraderRegistry

VERSION = "python-1.1.0"  # bump when calling, validating or clamping changes (the function's own changes are its own)

NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"  # an entry-point name or module:function; registered or not is checked apart


class PythonConfig(GraderModel):
    type: Literal["python"]
    function: str = Field(
        max_length=200, pattern=NAME_PATTERN, description="a registered function: entry-point name or 'module:function'"
    )
    timeout_s: float = Field(default=5.0, gt=0.0, le=60.0, description="the call is killed after this long")

    @field_validator("function")
    @classmethod
    def _is_registered(cls, function: str, info: ValidationInfo) -> str:
        registry: GraderRegistry | None = (info.context or {}).get("registry")
        if registry is not None and registry.resolve(function) is None:  # None: the shape only (the job spec's check)
            raise ValueError(registry.refusal(function))
        return function


class PythonGrader(Grader):
    """The registered function's reward for the sample, computed in a separate process under the operator's limits."""

    def __init__(self, config: PythonConfig, code: CodeGraders) -> None:
        super().__init__(config.name, VERSION)
        self.config = config
        self.code = code

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        name = self.config.function
        target = self.code.registry.resolve(name)
        if target is None:  # a spec stored before the operator unregistered it, or built around the check
            return self.error(self.code.registry.refusal(name), function=name)
        answer = await sandbox.call(target, sample, item, timeout_s=self.config.timeout_s,
                                    memory_mb=self.code.memory_mb, processes=self.code.processes)  # fmt: skip
        if "error" in answer:
            return self.error(answer["error"], function=name)
        raw = finite_number(answer.get("reward"))
        if raw is None:
            return self.error(f"{name} returned {shown(answer.get('reward'))}, not a finite number", function=name)
        details = {"function": name, "function_details": answer.get("details")}
        reward = clamp(raw)
        if reward != raw:
            details |= {"raw_reward": raw, "clamped": True}
            return self.result(reward, f"{name} returned {raw}, clamped into [0, 1]", **details)
        return self.result(reward, f"{name} returned {raw}", **details)
