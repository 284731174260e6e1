"""The generic tool box (environments/tools.py): OpenAI specs, and calls that never raise."""

from __future__ import annotations

import json
from typing import Annotated

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from environments.tools import (
    ERRORS,
    MAX_ARGUMENT_CHARS,
    Tool,
    ToolArguments,
    ToolBox,
    ToolError,
    ToolResult,
)


class AddArgs(ToolArguments):
    a: int = Field(ge=0, le=100)
    b: int = Field(ge=0, le=100)


class EchoArgs(ToolArguments):
    text: str = Field(max_length=20)
    tags: list[Annotated[str, Field(max_length=5)]] = Field(default_factory=list, max_length=3)
    from_: str | None = Field(None, alias="from")


def echo(text: str, tags: list[str], from_: str | None) -> str:
    if text == "refuse":
        raise ToolError("not that")
    if text == "crash":
        raise RuntimeError("internal detail that must not leak")
    if text == "number":
        return 5  # type: ignore[return-value]  # a buggy tool
    return f"{text}|{','.join(tags)}|{from_}"


BOX = ToolBox(
    [
        Tool("add", "Add two small numbers.", AddArgs, lambda a, b: str(a + b)),
        Tool("echo", "Echo the text.", EchoArgs, echo),
    ]
)


def test_specs_are_openai_function_tools():
    specs = BOX.specs()
    assert [s["function"]["name"] for s in specs] == ["add", "echo"]
    for spec in specs:
        assert set(spec) == {"type", "function"} and spec["type"] == "function"
        assert set(spec["function"]) == {"name", "description", "parameters"}
        params = spec["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert "title" not in params and all("title" not in p for p in params["properties"].values())
        json.dumps(spec)  # plain JSON
    add = specs[0]["function"]["parameters"]
    assert add["required"] == ["a", "b"] and add["properties"]["a"] == {"type": "integer", "minimum": 0, "maximum": 100}
    echo_params = specs[1]["function"]["parameters"]
    assert "from" in echo_params["properties"] and "from_" not in echo_params["properties"]  # aliases are public
    assert echo_params["required"] == ["text"]


def test_good_calls_run_the_function():
    assert BOX.call("add", '{"a": 2, "b": 3}') == ToolResult("5", None)
    assert BOX.call("echo", '{"text": "hi", "tags": ["x"], "from": "me"}') == ToolResult("hi|x|me", None)
    assert BOX.call("echo", '{"text": "hi"}').content == "hi||None"
    assert BOX.call("add", {"a": 1, "b": 1}).content == "2"  # already-parsed arguments are accepted too


def test_every_kind_of_bad_call_is_a_short_error():
    cases = {
        ("nope", "{}"): ("unknown_tool", "error: unknown tool 'nope'; tools: add, echo"),
        ("add", "{"): ("invalid_json", "error: arguments are not valid JSON"),
        ("add", "[1, 2]"): ("not_object", "error: arguments must be a JSON object"),
        ("add", "null"): ("not_object", "error: arguments must be a JSON object"),
        ("add", '{"a": "2", "b": 3}'): ("invalid_arguments", "error: add: a: input should be a valid integer"),
        ("add", '{"a": 2}'): ("invalid_arguments", "error: add: b: field required"),
        ("add", '{"a": 2, "b": 3, "c": 4}'): ("invalid_arguments", "error: add: c: extra inputs are not permitted"),
        ("add", '{"a": 200, "b": 3}'): ("invalid_arguments", "error: add: a: input should be less than or equal to 100"),  # noqa: E501
        ("add", '{"a": true, "b": 3}'): ("invalid_arguments", "error: add: a: input should be a valid integer"),
        ("echo", '{"text": "refuse"}'): ("tool_error", "error: not that"),
        ("echo", '{"text": "crash"}'): ("tool_crashed", "error: echo failed"),
        ("echo", '{"text": "number"}'): ("tool_crashed", "error: echo failed"),
        ("echo", '{"text": "hi", "from_": "me"}'): ("invalid_arguments", "error: echo: from_: extra inputs are not permitted"),  # noqa: E501
        ("add", 42): ("not_object", "error: arguments must be a JSON object"),
        (None, "{}"): ("unknown_tool", "error: unknown tool 'NoneType'; tools: add, echo"),
    }
    for (name, arguments), (code, content) in cases.items():
        result = BOX.call(name, arguments)
        assert (result.error, result.content) == (code, content), (name, arguments)
    assert BOX.call("add", '{"a": 1}').content == BOX.call("add", '{"a": 7}').content  # stable texts
    assert BOX.call("add", '{"x": 1, "y": 2}').content.endswith("(+3 more)")


def test_huge_arguments_are_refused_before_parsing():
    huge = json.dumps({"a": 1, "b": 2, "pad": "x" * 100_000})
    result = BOX.call("add", huge)
    assert result == ToolResult(f"error: arguments over {MAX_ARGUMENT_CHARS} chars", "too_large")
    deep = "[" * 100_000 + "]" * 100_000
    assert BOX.call("add", deep).error == "too_large"
    assert BOX.call("add", "[" * 1000 + "]" * 1000).error in ("invalid_json", "not_object")  # deep, yet short
    assert BOX.call("x" * 10_000, "{}").content.startswith("error: unknown tool 'xxxxxxxxxxxxxxxxxxxxx...'")


def test_duplicate_names_are_rejected_at_construction():
    try:
        ToolBox([Tool("add", "", AddArgs, str), Tool("add", "", AddArgs, str)])
    except ValueError as exc:
        assert "duplicate" in str(exc)
    else:
        raise AssertionError("duplicate tool names accepted")


@settings(max_examples=300, deadline=None)
@given(
    name=st.one_of(st.sampled_from(["add", "echo", "nope"]), st.text(max_size=30), st.none(), st.integers()),
    arguments=st.one_of(
        st.text(max_size=200),
        st.binary(max_size=50),
        st.none(),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
            lambda inner: st.one_of(
                st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
            ),
            max_leaves=12,
        ).map(json.dumps),
    ),
)
def test_call_is_total(name, arguments):
    result = BOX.call(name, arguments)
    assert isinstance(result, ToolResult) and isinstance(result.content, str)
    assert result.error is None or (result.error in ERRORS and result.content.startswith("error: "))
    assert len(result.content) < 200
