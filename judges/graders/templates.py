"""Templates as in OpenAI's graders: ``{{sample.output_text}}``, ``{{item.answer}}``, ``{{sample.output_json.a.0}}``.

A reference is a dotted path from ``sample`` or ``item`` through mappings (by key) and lists (by index). A string
renders as it is, any other value as JSON. A reference that does not resolve, or resolves to null, is a TemplateError
(which graders turn into an error result): a missing field is never graded as an empty string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator

REFERENCE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
ROOTS = ("sample", "item")
MAX_TEMPLATE_CHARS = 4_000
MAX_RENDERED_CHARS = 100_000  # what one template may render to: the comparing graders' and the judges' input


class TemplateError(ValueError):
    """A reference in a template does not resolve for this sample and item."""


def sample_from_text(output_text: str) -> dict[str, Any]:
    """The ``sample`` graders read, from a model's final reply: ``output_json`` is the reply parsed as a JSON object,
    or None when it is not one."""
    try:
        parsed = json.loads(output_text)
    except ValueError:
        parsed = None
    return {"output_text": output_text, "output_json": parsed if isinstance(parsed, dict) else None}


def check(template: str) -> str:
    """``template`` itself if it is at most MAX_TEMPLATE_CHARS long and every reference starts at ``sample`` or
    ``item`` and has no empty part; else ValueError (used by config validation, so a typo is caught at build time)."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"longer than the limit of {MAX_TEMPLATE_CHARS} characters")
    for match in REFERENCE.finditer(template):
        parts = match.group(1).split(".")
        if parts[0] not in ROOTS or "" in parts:
            raise ValueError(f"reference {match.group(0)!r} must be a dotted path from 'sample' or 'item'")
    return template


Template = Annotated[str, AfterValidator(check)]  # a config field holding a template, checked at build time


def render(template: str, *, sample: Any, item: Any) -> str:
    """``template`` with every reference replaced by its value; TemplateError names the first one that fails, or says
    that the text would be longer than MAX_RENDERED_CHARS."""
    roots = {"sample": sample, "item": item}
    pieces, size, end = [], 0, 0
    for match in REFERENCE.finditer(template):
        pieces += [template[end : match.start()], _text(match.group(1), _resolve(match.group(1), roots))]
        size, end = size + len(pieces[-2]) + len(pieces[-1]), match.end()
        if size > MAX_RENDERED_CHARS:
            raise TemplateError(f"the template renders to more than the limit of {MAX_RENDERED_CHARS} characters")
    pieces.append(template[end:])
    return "".join(pieces)


def render_input_and_reference(config: Any, *, sample: Any, item: Any) -> tuple[str, str]:
    """``config.input`` and ``config.reference`` rendered: what the comparing graders compare."""
    return render(config.input, sample=sample, item=item), render(config.reference, sample=sample, item=item)


def _resolve(path: str, roots: dict[str, Any]) -> Any:
    parts = path.split(".")
    value = roots[parts[0]]  # check() has made sure the root is one of ROOTS
    for depth, part in enumerate(parts[1:], start=1):
        where = ".".join(parts[:depth])
        if isinstance(value, Mapping):
            if part not in value:
                raise TemplateError(f"{{{{{path}}}}}: {where} has no field {part!r}")
            value = value[part]
        elif isinstance(value, Sequence) and not isinstance(value, str) and part.isascii() and part.isdigit():
            if int(part) >= len(value):
                raise TemplateError(f"{{{{{path}}}}}: {where} has {len(value)} elements, no index {part}")
            value = value[int(part)]
        else:
            kind = "null" if value is None else type(value).__name__
            raise TemplateError(f"{{{{{path}}}}}: {where} is {kind}, which has no field {part!r}")
    if value is None:
        raise TemplateError(f"{{{{{path}}}}} is null")
    return value


def _text(path: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError) as exc:  # a circular or too deeply nested value
        raise TemplateError(f"{{{{{path}}}}} cannot be written as JSON: {exc}") from None
