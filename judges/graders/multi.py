"""``multi``: several graders on one sample, combined by a formula, as OpenAI's multi grader.

The sub-graders run concurrently. ``calculate_output`` is an expression over their names, each the reward of that
grader, with numbers, arithmetic, comparisons, ``a if c else b`` and min, max, abs. It is checked at build time (a
name that is not a sub-grader is a config error) and evaluated by simpleeval. A grader that could not grade counts
0.0 and is listed in details["part_errors"]; if none could, the result is an error. A result outside [0, 1] is
clamped and recorded; a formula that fails on the values it gets (a division by zero) is an error result.
"""

from __future__ import annotations

import ast
import asyncio
import keyword
from collections.abc import Collection
from typing import TYPE_CHECKING, Literal

import simpleeval
from pydantic import Field, ValidationInfo, field_validator

from judges.graders.base import Grader, GradeResult, GraderModel, clamp, describe, finite_number

if TYPE_CHECKING:
    from judges.graders.build import GraderConfig

VERSION = "multi-1.0.0"  # bump when combining changes; a grader's version also names its parts' versions

FUNCTIONS = {"min": min, "max": max, "abs": abs}
ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Name, ast.Constant,
                 ast.Load, ast.operator, ast.unaryop, ast.cmpop)  # fmt: skip


class MultiConfig(GraderModel):
    type: Literal["multi"]
    graders: dict[str, GraderConfig] = Field(min_length=1, description="the parts, by the name the formula uses")
    calculate_output: str = Field(min_length=1, description="e.g. '0.5 * exact + 0.5 * fuzzy'")

    @field_validator("graders")
    @classmethod
    def _names_are_identifiers(cls, graders: dict) -> dict:
        for name in graders:
            if not name.isidentifier() or keyword.iskeyword(name) or name in FUNCTIONS:
                raise ValueError(f"{name!r} cannot be a formula's name: use a Python identifier, not {list(FUNCTIONS)}")
        return graders

    @field_validator("calculate_output")
    @classmethod
    def _formula_uses_known_graders(cls, formula: str, info: ValidationInfo) -> str:
        if "graders" in info.data:  # absent when the graders were invalid, which is reported already
            check_formula(formula, info.data["graders"])
        return formula


def check_formula(formula: str, names: Collection[str]) -> None:
    """Raises ValueError unless ``formula`` is one expression of numbers, ``names``, arithmetic, comparisons,
    if-else and calls of FUNCTIONS."""
    problem = _formula_problem(formula, names)
    if problem is not None:
        raise ValueError(problem)


def _formula_problem(formula: str, names: Collection[str]) -> str | None:
    try:
        tree = ast.parse(formula.strip(), mode="eval")
    except SyntaxError as exc:
        return f"not an expression: {exc.msg}"
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED_NODES):
            return (f"{type(node).__name__} is not allowed: use numbers, grader names, arithmetic, comparisons, "
                    f"if-else and {', '.join(FUNCTIONS)}")  # fmt: skip
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            return f"{node.value!r} is not a number"
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            return f"only {', '.join(FUNCTIONS)} can be called"
        if isinstance(node, ast.Name) and node.id not in names and node.id not in FUNCTIONS:
            return f"{node.id!r} is not one of the graders {sorted(names)}"
    return None


class MultiGrader(Grader):
    """The formula over the parts' rewards, clamped into [0, 1]."""

    def __init__(self, config: MultiConfig, graders: dict[str, Grader]) -> None:
        parts = ",".join(f"{name}={grader.version}" for name, grader in sorted(graders.items()))
        super().__init__(config.name, f"{VERSION}({parts})")
        self.calculate_output = config.calculate_output.strip()
        self.graders = graders

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        results = await asyncio.gather(*(grader.grade(sample, item) for grader in self.graders.values()))
        parts = dict(zip(self.graders, results))
        details: dict = {"parts": {name: {"reward": r.reward, **r.details} for name, r in parts.items()}}
        failed = {name: r.details["error"] for name, r in parts.items() if "error" in r.details}
        if failed:
            details["part_errors"] = failed
        if len(failed) == len(parts):
            return self.error("no part could grade the sample", **details)
        rewards = {name: r.reward for name, r in parts.items()}  # an error result's reward is 0.0
        try:
            value = simpleeval.SimpleEval(names=rewards, functions=FUNCTIONS).eval(self.calculate_output)
        except Exception as exc:  # noqa: BLE001 -- arithmetic on these values: a division by zero, a huge power
            return self.error(f"calculate_output failed: {describe(exc)}", **details)
        raw = finite_number(value)
        if raw is None:
            return self.error(f"calculate_output gave {value!r}, not a finite number", **details)
        reward = clamp(raw)
        shown = ", ".join(f"{name}={part:.4g}" for name, part in rewards.items())
        reason = f"{self.calculate_output} = {raw:.4g} with {shown}"
        if reward != raw:
            details |= {"raw_reward": raw, "clamped": True}
            reason += ", clamped into [0, 1]"
        return self.result(reward, reason, **details)
