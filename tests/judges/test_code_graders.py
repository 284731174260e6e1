"""Code graders: only registered functions run, named without importing anything, each in a real child process under
the operator's limits (memory, environment, processes at once)."""

from __future__ import annotations

import json
import sys
from types import MappingProxyType

import pytest

from judges.graders import (
    CodeGraders,
    GraderConfigError,
    GradeResult,
    GraderRegistry,
    build_grader,
    check_grader,
    sample_from_text,
)
from judges.graders.base import finite_number, shown
from judges.graders.python import PythonGrader

FUNCTIONS = "tests.judges.grader_functions"
REGISTRY = GraderRegistry.load(f"{FUNCTIONS}:{name}" for name in ("exact", "secrets_seen", "hog", "records_its_run"))
CLIENT_CHOSEN = ["this:x", "this.x:y", "unittest.__main__:main", "unittest.__main__.x:main", "os:system",
                 "subprocess:Popen", "torch:zeros", "exact"]  # fmt: skip


def python(function: str, name: str = "fn") -> dict:
    return {"type": "python", "name": name, "function": function}


async def grade(config: dict, item: object, output: str = "42", **limits) -> GradeResult:
    grader = build_grader(config, code=CodeGraders(REGISTRY, **limits))
    return await grader.grade(sample_from_text(output), item)


def newly_imported(before: set[str], function: str) -> set[str]:
    top = function.partition(":")[0].split(".")[0]
    return {name for name in set(sys.modules) - before if name == top or name.startswith(top + ".")}


@pytest.mark.parametrize("function", CLIENT_CHOSEN)
def test_an_unregistered_function_is_a_config_error_and_nothing_it_names_is_imported(function):
    before = set(sys.modules)
    with pytest.raises(GraderConfigError, match="is not a registered grader function") as raised:
        build_grader(python(function), code=CodeGraders(REGISTRY))
    assert str(raised.value).startswith("function: ") and "ARTSVC_GRADER_FUNCTIONS" in str(raised.value)
    assert f"{FUNCTIONS}:exact" in str(raised.value)  # what may be named instead
    check_grader(python(function))  # the job spec's check: the shape only, and no import either
    assert newly_imported(before, function) == set()


def test_without_a_registry_no_code_grader_may_be_built():
    with pytest.raises(GraderConfigError, match=r"registered: none"):
        build_grader(python(f"{FUNCTIONS}:exact"))


def test_a_registry_entry_must_name_a_module_and_function():
    with pytest.raises(ValueError, match="'module:function'"):
        GraderRegistry.load(["tests.judges.grader_functions"])


@pytest.mark.asyncio
async def test_an_entry_point_name_runs_its_registered_target():
    target = f"{FUNCTIONS}:exact"
    registry = GraderRegistry(MappingProxyType({"exact_answer": target}), frozenset({target}))
    assert registry.resolve("exact_answer") == registry.resolve(f"{FUNCTIONS}:exact") == f"{FUNCTIONS}:exact"
    grader = build_grader(python("exact_answer"), code=CodeGraders(registry))
    result = await grader.grade(sample_from_text("42"), {"answer": 42})
    assert result.reward == 1.0 and result.details["function"] == "exact_answer"


@pytest.mark.asyncio
async def test_the_grade_time_check_refuses_a_name_this_worker_has_not_registered():
    stored = check_grader(python(f"{FUNCTIONS}:exact"))  # a spec validated for its shape, as stored specs are
    result = await PythonGrader(stored, CodeGraders()).grade(sample_from_text("42"), {"answer": 42})
    assert result.reward == 0.0 and "is not a registered grader function" in result.details["error"]


@pytest.mark.asyncio
async def test_the_function_cannot_read_the_services_secrets(monkeypatch):
    secrets = ["ARTSVC_JUDGE_API_KEY", "ARTSVC_DATABASE_URL", "OPENAI_API_KEY", "DATABASE_URL", "GITHUB_TOKEN",
               "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"]  # fmt: skip
    for name in secrets:
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    result = await grade(python(f"{FUNCTIONS}:secrets_seen"), {"names": secrets})
    assert "error" not in result.details, result.details
    assert result.details["function_details"]["seen"] == [] and result.reward == 0.0
    assert "LC_ALL" in result.details["function_details"]["env"]  # the locale does reach it


@pytest.mark.asyncio
async def test_a_function_past_the_memory_limit_is_an_error_result():
    result = await grade(python(f"{FUNCTIONS}:hog"), {}, memory_mb=256)
    assert result.reward == 0.0 and "out of memory (the limit is ARTSVC_GRADER_MEMORY_MB)" in result.details["error"]


@pytest.mark.asyncio
async def test_at_most_the_processes_limit_of_grader_processes_run_at_once(tmp_path):
    parts = {f"p{i}": python(f"{FUNCTIONS}:records_its_run", name=f"p{i}") for i in range(4)}
    config = {"type": "multi", "name": "all", "graders": parts, "calculate_output": "p0"}
    result = await grade(config, {"folder": str(tmp_path)}, processes=2)
    assert "part_errors" not in result.details, result.details
    runs = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    at_once = max(sum(start <= moment < end for start, end in runs) for moment, _ in runs)
    assert len(runs) == 4 and at_once <= 2


def test_a_huge_number_is_shown_and_checked_without_raising():
    huge = 10**5000  # past Python's limit for writing an int as digits
    assert finite_number(huge) is None and shown(huge) == f"<an integer of {huge.bit_length()} bits>"
    assert shown("x" * 500).endswith("...") and len(shown("x" * 500)) == 103
