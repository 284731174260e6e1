"""What a client may ask of the graders at submission: only code the operator registered (named without importing
anything), and only bounded work (formulas, nesting, fan-out, templates, turns). Each refusal is a 422 naming the
field and the limit, never a 500."""

from __future__ import annotations

import sys

import pytest

from judges.graders import build_grader, sample_from_text
from service.app import create_app
from tests.databases import sqlite_only
from tests.environments.test_plugins import plugin_path  # noqa: F401 -- the echo plugin, installed once per module

pytestmark = sqlite_only  # refusals at the API's door: nothing here depends on the database

REGISTERED = "tests.judges.grader_functions:exact"
CLIENT_CHOSEN = ["this:x", "this.x:y", "unittest.__main__:main", "unittest.__main__.x:main", "os:system",
                 "subprocess:Popen", "torch:zeros"]  # fmt: skip
EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}  # fmt: skip


@pytest.fixture
def app(settings, engine):
    update = {"grader_functions": [REGISTERED], "max_body_bytes": 64 * 1024}  # the default: room for 30,000 minus signs
    return create_app(settings.model_copy(update=update), engine=engine)


def python(function: str, name: str = "fn") -> dict:
    return {"type": "python", "name": name, "function": function}


def multi(formula: str, **graders: dict) -> dict:
    return {"type": "multi", "name": "combined", "graders": graders or {"a": EXACT}, "calculate_output": formula}


def submit(client, headers, grader: dict, **job):
    body = {"environment": "math", "reward": {"mode": "grader", "grader": grader}, **job}
    return client.post("/v1/jobs", json=body, headers=headers)


@pytest.mark.parametrize("function", CLIENT_CHOSEN)
def test_a_function_the_operator_did_not_register_is_refused_and_never_imported(client, auth, function):
    top = function.partition(":")[0].split(".")[0]
    before = {name for name in sys.modules if name == top or name.startswith(top + ".")}
    response = submit(client, auth(), python(function))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(f"reward.grader: function: {function!r} is not a registered grader function")
    assert f"registered: {REGISTERED}" in detail and "ARTSVC_GRADER_FUNCTIONS" in detail
    assert {name for name in sys.modules if name == top or name.startswith(top + ".")} == before


def test_a_registered_function_is_accepted(client, auth):
    response = submit(client, auth(), multi("a", a=python(REGISTERED)))
    assert response.status_code == 201, response.text


@pytest.mark.asyncio
async def test_an_entry_point_grader_runs(client, auth, settings, plugin_path, monkeypatch):  # noqa: F811
    assert submit(client, auth(), python("echo_exact")).status_code == 422  # not installed yet
    monkeypatch.syspath_prepend(str(plugin_path))
    response = submit(client, auth(), python("echo_exact"))
    assert response.status_code == 201, response.text
    code = settings.code_graders()  # the worker's own registry, read from the installed package's metadata
    assert code.registry.resolve("echo_exact") == "artsvc_echo_graders:exact"
    grader = build_grader(python("echo_exact"), code=code)
    assert (await grader.grade(sample_from_text("abc"), {"word": "abc"})).reward == 1.0
    assert (await grader.grade(sample_from_text("abd"), {"word": "abc"})).reward == 0.0


@pytest.mark.parametrize(
    ("grader", "words"),
    [
        (multi("3999999**3999999"), "reward.grader: calculate_output: the exponent of ** must be a number of at most"),
        (multi("3999999 * a"), "calculate_output: the number 3999999 is beyond the limit of 1e+06"),
        (multi("-" * 30_000 + "a"), "calculate_output: longer than the limit of 1000 characters"),
        (multi("+".join(["a"] * 20_000)), "calculate_output: longer than the limit of 1000 characters"),
        (multi("(" * 250 + "a" + ")" * 250), "calculate_output: not an expression: too many nested parentheses"),
        (multi("p0", **{f"p{i}": python(REGISTERED, f"p{i}") for i in range(5)}), "more than 4 python graders"),
        (multi("a", **{f"a{i}": EXACT for i in range(17)}), "more than 16 graders in one tree"),
        ({**EXACT, "reference": "x" * 5_000}, "reward.grader: reference: longer than the limit of 4000 characters"),
    ],
)
def test_unbounded_grader_work_is_refused_naming_the_limit(client, auth, grader, words):
    response = submit(client, auth(), grader)
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]


def test_a_grader_nested_200_deep_is_refused_not_a_server_error(client, auth):
    grader = EXACT
    for _ in range(200):
        grader = multi("a", a=grader)
    response = submit(client, auth(), grader)
    assert response.status_code == 422, response.text
    assert "reward.grader: multi graders nested more than 3 deep" in response.json()["detail"]


@pytest.mark.parametrize("turns", [4097, 10**9])
def test_2048_turns_are_bounded(client, auth, turns):
    body = {"environment": "2048", "environment_args": {"max_turns": turns}}
    response = client.post("/v1/jobs", json=body, headers=auth())
    assert response.status_code == 422, response.text
    assert "environment '2048': max_turns must be an integer from 1 to 4096" in response.json()["detail"]
    at_the_limit = {**body, "environment_args": {"max_turns": 4096}}
    assert client.post("/v1/jobs", json=at_the_limit, headers=auth()).status_code == 201
