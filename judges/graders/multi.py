"""``multi``: several graders on one sample, combined by a formula, as OpenAI's multi grader.

The sub-graders run concurrently. ``calculate_output`` is an expression over their names, each the reward of that
grader, with numbers, arithmetic, comparisons, ``a if c else b`` and min, max, abs. It is checked at build time (a
name that is not a sub-grader is a config error) and bounded there: its length, node count and nesting, its numbers
(at most MAX_CONSTANT) and its powers (a constant exponent of at most MAX_EXPONENT). It is evaluated by simpleeval in
floating point, off the event loop under FORMULA_TIMEOUT_S, so no formula costs more than a few float operations per
node. A grader that could not grade counts 0.0 and is listed in details["part_errors"]; if none could, the result is
an error. A result outside [0, 1] is clamped and recorded; a formula that fails on the values it gets (a division by
zero, an overflow) is an error result.
"""

from __future__ import annotations

import ast
import asyncio
import keyword
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import simpleeval
from pydantic import Field, ValidationInfo, field_validator

from judges.graders.base import Grader, GradeResult, GraderModel, clamp, describe, finite_number, shown
from judges.graders.python import PythonConfig
from judges.graders.score_model import ScoreModelConfig
from judges.graders.string_check import StringCheckConfig
from judges.graders.text_similarity import TextSimilarityConfig

VERSION = "multi-1.1.0"  # bump when combining changes; a grader's version also names its parts' versions

FUNCTIONS = {"min": min, "max": max, "abs": abs}
OPERATORS = {op: simpleeval.DEFAULT_OPERATORS[op] for op in (
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)}  # fmt: skip
ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Name, ast.Constant,
                 ast.Load, *OPERATORS)  # fmt: skip
MAX_FORMULA_CHARS = 1_000  # short enough that parsing cannot exhaust the parser's stack or memory
MAX_FORMULA_NODES = 200
MAX_FORMULA_DEPTH = 32  # the evaluator recurses once per level
MAX_CONSTANT = 1e6
MAX_EXPONENT = 8
FORMULA_TIMEOUT_S = 1.0
# Formulas get threads of their own, so that a slow metric in the default executor never makes one wait past its limit.
_FORMULA_THREADS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grader-formula")


class MultiConfig(GraderModel):
    type: Literal["multi"]
    graders: dict[str, GraderConfig] = Field(min_length=1, description="the parts, by the name the formula uses")
    calculate_output: str = Field(min_length=1, description="e.g. '0.5 * exact + 0.5 * fuzzy'")

    @field_validator("graders")
    @classmethod
    def _names_are_identifiers(cls, graders: dict) -> dict:
        for name in graders:
            if not name.isidentifier() or keyword.iskeyword(name) or name in FUNCTIONS or len(name) > 64:
                raise ValueError(f"{name[:64]!r} cannot be a formula's name: use a Python identifier of up to 64 "
                                 f"characters, not {list(FUNCTIONS)}")  # fmt: skip
        return graders

    @field_validator("calculate_output")
    @classmethod
    def _formula_uses_known_graders(cls, formula: str, info: ValidationInfo) -> str:
        if "graders" in info.data:  # absent when the graders were invalid, which is reported already
            check_formula(formula, info.data["graders"])
        return formula


# Any grader's config, told apart by ``type``. A multi grader's parts are any of them, multi included, so the union is
# defined here, beside the one config that nests it, and completes MultiConfig's annotation of its parts.
GraderConfig = Annotated[
    StringCheckConfig | TextSimilarityConfig | PythonConfig | ScoreModelConfig | MultiConfig,
    Field(discriminator="type"),
]
MultiConfig.model_rebuild()


def check_formula(formula: str, names: Collection[str]) -> None:
    """Raises ValueError unless ``formula`` is one expression of numbers, ``names``, arithmetic, comparisons,
    if-else and calls of FUNCTIONS, within the bounds above."""
    problem = _formula_problem(formula, names)
    if problem is not None:
        raise ValueError(problem)


def parse_formula(formula: str) -> ast.Expression:
    """The formula's tree with every number a float, so that evaluating it is float arithmetic only."""
    tree = ast.parse(formula.strip(), mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = float(node.value)
    return tree


def _formula_problem(formula: str, names: Collection[str]) -> str | None:
    if len(formula) > MAX_FORMULA_CHARS:  # before parsing: the parser's own recursion and memory are not bounded
        return f"longer than the limit of {MAX_FORMULA_CHARS} characters"
    try:
        tree = ast.parse(formula.strip(), mode="eval")
    except SyntaxError as exc:
        return f"not an expression: {exc.msg}"
    except (RecursionError, MemoryError, ValueError):
        return "not an expression this server can read"
    nodes, deepest, stack = 0, 0, [(tree, 0)]
    while stack:  # counts expressions (numbers, names, operations, calls), not the parser's operator and context nodes
        node, depth = stack.pop()
        if isinstance(node, ast.expr):
            nodes, depth = nodes + 1, depth + 1
            deepest = max(deepest, depth)
        if (problem := _node_problem(node, names)) is not None:
            return problem
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))
    if nodes > MAX_FORMULA_NODES:
        return f"{nodes} parts, more than the limit of {MAX_FORMULA_NODES}"
    if deepest > MAX_FORMULA_DEPTH:
        return f"nested {deepest} deep, more than the limit of {MAX_FORMULA_DEPTH}"
    return None


def _node_problem(node: ast.AST, names: Collection[str]) -> str | None:
    if not isinstance(node, ALLOWED_NODES):
        return (f"{type(node).__name__} is not allowed: use numbers, grader names, arithmetic (+ - * / // % **), "
                f"comparisons, if-else and {', '.join(FUNCTIONS)}")  # fmt: skip
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float)):
            return f"{shown(node.value)} is not a number"
        if not abs(node.value) <= MAX_CONSTANT:  # also refuses nan
            return f"the number {shown(node.value)} is beyond the limit of {MAX_CONSTANT:g}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not _small_exponent(node.right):
        return f"the exponent of ** must be a number of at most {MAX_EXPONENT}"
    if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
        return f"only {', '.join(FUNCTIONS)} can be called"
    if isinstance(node, ast.Name) and node.id not in names and node.id not in FUNCTIONS:
        return f"{node.id!r} is not one of the graders {sorted(names)}"
    return None


def _small_exponent(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) <= MAX_EXPONENT


class MultiGrader(Grader):
    """The formula over the parts' rewards, clamped into [0, 1]."""

    def __init__(self, config: MultiConfig, graders: dict[str, Grader]) -> None:
        parts = ",".join(f"{name}={grader.version}" for name, grader in sorted(graders.items()))
        super().__init__(config.name, f"{VERSION}({parts})")
        self.calculate_output = config.calculate_output.strip()
        self.formula = parse_formula(self.calculate_output)
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
            evaluation = asyncio.get_running_loop().run_in_executor(_FORMULA_THREADS, self._evaluate, rewards)
            value = await asyncio.wait_for(evaluation, FORMULA_TIMEOUT_S)
        except TimeoutError:
            return self.error(f"calculate_output took more than {FORMULA_TIMEOUT_S} s", **details)
        except Exception as exc:  # noqa: BLE001 -- arithmetic on these values: a division by zero, an overflow
            return self.error(f"calculate_output failed: {describe(exc)}", **details)
        raw = finite_number(value)
        if raw is None:
            return self.error(f"calculate_output gave {shown(value)}, not a finite number", **details)
        reward = clamp(raw)
        values = ", ".join(f"{name}={part:.4g}" for name, part in rewards.items())
        reason = f"{self.calculate_output} = {raw:.4g} with {values}"
        if reward != raw:
            details |= {"raw_reward": raw, "clamped": True}
            reason += ", clamped into [0, 1]"
        return self.result(reward, reason, **details)

    def _evaluate(self, rewards: dict[str, float]) -> object:
        evaluator = simpleeval.SimpleEval(operators=OPERATORS, functions=FUNCTIONS, names=rewards)
        return evaluator.eval(self.calculate_output, previously_parsed=self.formula.body)
