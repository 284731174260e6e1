"""No client text may hold NUL: SQLite would store it and PostgreSQL refuse it later (a 500). Every free-text field of
a job or an evaluation is refused at validation with a 422 naming the field, on both databases."""

from __future__ import annotations

import pytest

GRADER = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
          "operation": "eq"}  # fmt: skip
JOB_FIELDS = [
    ("environment", {"environment": "ma\x00th"}, ""),
    ("environment_args", {"environment": "math", "environment_args": {"ke\x00y": 1}}, " at ['ke\\x00y']"),
    ("environment_args", {"environment": "math", "environment_args": {"key": "val\x00ue"}}, " at ['key']"),
    ("model.name", {"environment": "math", "model": {"name": "de\x00mo"}}, ""),
    ("model.base_model", {"environment": "math", "model": {"base_model": "embedded/char\x00"}}, ""),
    ("reward.judge_model", {"environment": "math", "reward": {"mode": "ruler", "judge_model": "openai/j\x00"}}, ""),
    ("reward.rubric", {"environment": "math", "reward": {"mode": "ruler", "judge_model": "a/j", "rubric": "\x00"}}, ""),
    ("reward.grader", {"environment": "math", "reward": {"mode": "grader", "grader": {**GRADER, "reference": "\x00"}}},
     " at ['reference']"),
    ("reward.grader", {"environment": "math", "reward": {"mode": "grader", "grader": {**GRADER, "na\x00me": "x"}}},
     " at ['na\\x00me']"),
    ("validation.baseline_model", {"environment": "math", "validation": {"baseline_model": "openai/b\x00"}}, ""),
]  # fmt: skip
EVALUATION_FIELDS = [
    ("model.LitellmModel.litellm", {"model": {"litellm": "openai/b\x00"}, "environment": "math"}, ""),
    ("model.CheckpointModel.job_id", {"model": {"job_id": "\x00"}}, ""),
    ("environment", {"model": {"litellm": "openai/b"}, "environment": "ma\x00th"}, ""),
    ("environment_args", {"model": {"litellm": "openai/b"}, "environment": "math", "environment_args": {"k": "\x00"}},
     " at ['k']"),
]  # fmt: skip


def _refused(client, path: str, body: dict, headers: dict, field: str, where: str) -> None:
    response = client.post(path, json=body, headers=headers)
    assert response.status_code == 422, response.text
    assert f"{field}: holds a NUL character (\\x00){where}" in response.json()["detail"].split("; ")


@pytest.mark.parametrize(("field", "spec", "where"), JOB_FIELDS, ids=[f"{f}{w}" for f, _, w in JOB_FIELDS])
def test_a_nul_in_any_text_of_a_job_is_refused_naming_the_field(client, auth, field, spec, where):
    _refused(client, "/v1/jobs", spec, auth(), field, where)


@pytest.mark.parametrize(("field", "spec", "where"), EVALUATION_FIELDS, ids=[f for f, _, _ in EVALUATION_FIELDS])
def test_a_nul_in_any_text_of_an_evaluation_is_refused_naming_the_field(client, auth, field, spec, where):
    _refused(client, "/v1/evaluations", spec, auth(), field, where)
