"""``string_check``: compare two rendered templates as OpenAI's string check grader does; 1.0 if it holds, else 0.0.

eq: equal; ne: not equal; like: the input contains the reference; ilike: the same ignoring case (Unicode case
folding, so "STRASSE" contains "straße"). No whitespace is stripped: templates render exactly what they reference.
"""

from __future__ import annotations

from typing import Literal

from judges.graders import templates
from judges.graders.base import Grader, GradeResult, GraderModel, snippet
from judges.graders.templates import Template

VERSION = "string_check-1.0.0"  # bump when any verdict could change

OPERATIONS = {
    "eq": lambda text, reference: text == reference,
    "ne": lambda text, reference: text != reference,
    "like": lambda text, reference: reference in text,
    "ilike": lambda text, reference: reference.casefold() in text.casefold(),
}


class StringCheckConfig(GraderModel):
    type: Literal["string_check"]
    input: Template
    reference: Template
    operation: Literal["eq", "ne", "like", "ilike"]


class StringCheckGrader(Grader):
    """1.0 when ``operation`` holds between the rendered input and reference, else 0.0."""

    def __init__(self, config: StringCheckConfig) -> None:
        super().__init__(config.name, VERSION)
        self.config = config

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        try:
            text, reference = templates.render_input_and_reference(self.config, sample=sample, item=item)
        except templates.TemplateError as exc:
            return self.error(str(exc))
        holds = OPERATIONS[self.config.operation](text, reference)
        verdict = "holds" if holds else "does not hold"
        return self.result(float(holds), f"{self.config.operation} {verdict} for input {snippet(text)} "
                           f"and reference {snippet(reference)}")  # fmt: skip
