"""Bounds on a grader tree as a client sends it, checked on the raw JSON before pydantic walks it.

A multi grader nests graders: unbounded, one request could ask for hundreds of processes per sample (python parts)
or nest deeper than validation and serialisation can recurse. The walk here is iterative, so it answers for any
depth; the bounds are this module's constants.
"""

from __future__ import annotations

from typing import Any

MAX_MULTI_DEPTH = 3  # multi graders inside multi graders, the outermost counted
MAX_GRADERS = 16  # every grader in the tree, multi graders included
MAX_PYTHON_GRADERS = 4  # each one a process per graded sample
MAX_JSON_DEPTH = 12  # of any value besides the graders of a multi (a score_model's messages are 4 deep)


def tree_problem(config: Any) -> str | None:
    """Why ``config`` is too big a tree (naming the limit), or None. Leaves everything else to validation."""
    graders = python = 0
    stack: list[tuple[Any, int, int]] = [(config, 0, 0)]  # (value, multi depth, depth within one grader)
    while stack:
        value, multis, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"a value nested more than {MAX_JSON_DEPTH} deep"
        if depth == 0:  # a grader
            graders += 1
            kind = value.get("type") if isinstance(value, dict) else None
            python += kind == "python"
            multis += kind == "multi"
            if graders > MAX_GRADERS:
                return f"more than {MAX_GRADERS} graders in one tree, the limit"
            if python > MAX_PYTHON_GRADERS:
                return f"more than {MAX_PYTHON_GRADERS} python graders in one tree, the limit"
            if multis > MAX_MULTI_DEPTH:
                return f"multi graders nested more than {MAX_MULTI_DEPTH} deep, the limit"
            if kind == "multi" and isinstance(parts := value.get("graders"), dict):
                stack.extend((part, multis, 0) for part in parts.values())
                value = {key: item for key, item in value.items() if key != "graders"}
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, multis, depth + 1) for child in children)
    return None
