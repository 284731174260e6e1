"""Graders in the manner of OpenAI's reinforcement fine-tuning graders, usable as the reward of any environment.

``build_grader(config)`` turns a JSON config (``{"type": "string_check" | "text_similarity" | "python" |
"score_model" | "multi", "name": ..., ...}``) into a Grader, or raises GraderConfigError naming the bad field;
``check_grader`` only checks one. A python grader runs only a function the operator registered (``CodeGraders``).
``await grader.grade(sample, item)`` never raises: ``sample`` is ``{"output_text": str, "output_json": dict | None}``
(``sample_from_text`` makes one from a reply), ``item`` the scenario; templates in the config reference both as
``{{sample.output_text}}`` and ``{{item.field.sub}}``. A GradeResult whose details have "error" was not graded.
"""

from judges.graders.base import Grader, GraderConfigError, GradeResult
from judges.graders.build import build_grader, check_grader
from judges.graders.registry import CodeGraders, GraderRegistry
from judges.graders.templates import sample_from_text

__all__ = [
    "CodeGraders",
    "GradeResult",
    "Grader",
    "GraderConfigError",
    "GraderRegistry",
    "build_grader",
    "check_grader",
    "sample_from_text",
]
