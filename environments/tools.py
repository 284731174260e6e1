"""Function tools a policy may call, and the one place where its calls are checked.

A policy's tool call is untrusted text: the name may be made up, the arguments may be broken
JSON, the wrong shape, or megabytes long, and the tool itself may fail. :meth:`ToolBox.call`
turns every one of those into a short error message the policy reads as the tool's reply (the
same few stable texts every time, so a small model can learn what they mean) and never raises;
environments count the errors instead of crashing a rollout on them.

Arguments are pydantic models (:class:`ToolArguments`: strict types, no extra fields), so the
OpenAI tool spec a policy is shown and the validation its calls get come from one definition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

MAX_ARGUMENT_CHARS = 2048  # longer arguments are refused unparsed
MAX_CONTENT_CHARS = 4000  # a tool's reply is cut to this

# ToolResult.error codes
UNKNOWN_TOOL = "unknown_tool"
TOO_LARGE = "too_large"
INVALID_JSON = "invalid_json"
NOT_OBJECT = "not_object"
INVALID_ARGUMENTS = "invalid_arguments"
TOOL_ERROR = "tool_error"  # the tool refused the request (ToolError): a normal, explained failure
TOOL_CRASHED = "tool_crashed"  # the tool raised anything else, or returned a non-string
ERRORS = (UNKNOWN_TOOL, TOO_LARGE, INVALID_JSON, NOT_OBJECT, INVALID_ARGUMENTS, TOOL_ERROR, TOOL_CRASHED)


class ToolArguments(BaseModel):
    """Base for argument models: strict types (no "5" for 5), unknown fields rejected."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=False)


class ToolError(Exception):
    """Raised by a tool function to refuse a call; its message is shown as ``error: <message>``."""


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the policy reads: the tool's reply, or "error: ..."
    error: str | None = None  # one of ERRORS, None on success


@dataclass(frozen=True)
class Tool:
    """One function tool: called with the validated arguments as keywords (by field name)."""

    name: str
    description: str
    arguments: type[ToolArguments]
    function: Callable[..., str]

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-tool dict for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": _schema(self.arguments)},
        }


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema (by alias) without pydantic's decorative titles."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schema = strip(model.model_json_schema(by_alias=True))
    schema.setdefault("properties", {})
    return schema


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validation_message(exc: ValidationError) -> str:
    """``field: problem`` of the first error (pydantic's messages, lower-cased), plus a count."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "invalid arguments"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    message = f"{_short(where)}: {str(first.get('msg', 'invalid')).lower()}"
    if len(errors) > 1:
        message += f" (+{len(errors) - 1} more)"
    return message


class ToolBox:
    """A fixed set of tools by name: their OpenAI specs, and total dispatch of calls."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"duplicate tool name {tool.name!r}")
            self._tools[tool.name] = tool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [tool.spec() for tool in self._tools.values()]

    def _error(self, code: str, message: str) -> ToolResult:
        return ToolResult(content=f"error: {message}", error=code)

    def call(self, name: Any, arguments: Any) -> ToolResult:
        """Run tool ``name`` with ``arguments`` (a JSON object as a string). Never raises."""
        try:
            return self._call(name, arguments)
        except Exception:  # noqa: BLE001 - a last line of defence: the contract is "never raises"
            return self._error(TOOL_CRASHED, "tool failed")

    def _call(self, name: Any, arguments: Any) -> ToolResult:
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            shown = _short(name) if isinstance(name, str) else type(name).__name__
            return self._error(UNKNOWN_TOOL, f"unknown tool {shown!r}; tools: {', '.join(self._tools)}")
        if isinstance(arguments, Mapping):
            parsed: Any = dict(arguments)
        else:
            if not isinstance(arguments, str):
                return self._error(NOT_OBJECT, "arguments must be a JSON object")
            if len(arguments) > MAX_ARGUMENT_CHARS:
                return self._error(TOO_LARGE, f"arguments over {MAX_ARGUMENT_CHARS} chars")
            if not arguments.strip():
                arguments = "{}"  # some clients send "" for a call without arguments
            try:
                parsed = json.loads(arguments)
            except (ValueError, RecursionError):
                return self._error(INVALID_JSON, "arguments are not valid JSON")
        if not isinstance(parsed, dict):
            return self._error(NOT_OBJECT, "arguments must be a JSON object")
        try:
            validated = tool.arguments.model_validate(parsed)
        except ValidationError as exc:
            return self._error(INVALID_ARGUMENTS, f"{tool.name}: {_validation_message(exc)}")
        try:
            content = tool.function(**{field: getattr(validated, field) for field in type(validated).model_fields})
        except ToolError as exc:
            return self._error(TOOL_ERROR, str(exc) or "tool refused the call")
        except Exception:  # noqa: BLE001 - a tool bug is reported to the policy, not raised
            return self._error(TOOL_CRASHED, f"{tool.name} failed")
        if not isinstance(content, str):
            return self._error(TOOL_CRASHED, f"{tool.name} failed")
        return ToolResult(content=content[:MAX_CONTENT_CHARS])
