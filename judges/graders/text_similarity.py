"""``text_similarity``: how close the rendered input is to the reference, in [0, 1], as OpenAI's grader of that name.

fuzzy_match is rapidfuzz's ``fuzz.ratio`` / 100 (normalised Indel similarity; two empty strings are equal, 1.0);
bleu is sacrebleu's ``sentence_bleu`` / 100 with its defaults (13a tokens, exponential smoothing); rouge_1, rouge_2
and rouge_l are rouge_score's F-measure without stemming (its tokenizer lowercases and keeps ASCII letters and
digits only, so text without any scores 0). The metrics run in a worker thread under METRIC_TIMEOUT_S: ROUGE-L is
quadratic in pure Python, so texts longer than MAX_TEXT_CHARS are an error result rather than a stalled service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache
from typing import Literal

from pydantic import Field

from judges.graders import templates
from judges.graders.base import Grader, GradeResult, GraderModel, clamp
from judges.graders.templates import Template

VERSION = "text_similarity-1.0.0"  # bump when any score could change (a metric, its options, a library's defaults)

MAX_TEXT_CHARS = 10_000  # ROUGE-L on two texts this long takes about a second
METRIC_TIMEOUT_S = 30.0  # past it the result is an error (the thread finishes on its own; its answer is dropped)

Metric = Literal["fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_l"]


class TextSimilarityConfig(GraderModel):
    type: Literal["text_similarity"]
    input: Template
    reference: Template
    evaluation_metric: Metric
    pass_threshold: float | None = Field(default=None, ge=0.0, le=1.0, description="details carry passed: score >= it")


class TextSimilarityGrader(Grader):
    """The metric's similarity of the rendered input to the rendered reference, in [0, 1]."""

    def __init__(self, config: TextSimilarityConfig) -> None:
        super().__init__(config.name, VERSION)
        self.config = config

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        try:
            text, reference = templates.render_input_and_reference(self.config, sample=sample, item=item)
        except templates.TemplateError as exc:
            return self.error(str(exc))
        too_long = [f"{side} has {len(value)}" for side, value in (("input", text), ("reference", reference))
                    if len(value) > MAX_TEXT_CHARS]  # fmt: skip
        if too_long:
            return self.error(f"{' and '.join(too_long)} characters, more than {MAX_TEXT_CHARS}")
        metric = self.config.evaluation_metric
        try:
            raw = await asyncio.wait_for(asyncio.to_thread(similarity(metric), text, reference), METRIC_TIMEOUT_S)
        except TimeoutError:
            return self.error(f"{metric} took more than {METRIC_TIMEOUT_S} s")
        score = clamp(raw)  # BLEU can be 1.0000000000000004
        details = {"metric": metric, "score": score}
        reason = f"{metric} similarity {score:.4f}"
        if self.config.pass_threshold is not None:
            details["passed"] = score >= self.config.pass_threshold
            relation = "at least" if details["passed"] else "below"
            reason += f", {relation} the pass threshold {self.config.pass_threshold}"
        return self.result(score, reason, **details)


def similarity(metric: Metric) -> Callable[[str, str], float]:
    """The library call for ``metric``, as f(text, reference) -> score (libraries imported on first use)."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return lambda text, reference: fuzz.ratio(text, reference) / 100.0
    if metric == "bleu":
        import sacrebleu

        return lambda text, reference: sacrebleu.sentence_bleu(text, [reference]).score / 100.0
    rouge_type = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_l": "rougeL"}[metric]
    return lambda text, reference: _rouge_scorer(rouge_type).score(reference, text)[rouge_type].fmeasure


@cache
def _rouge_scorer(rouge_type: str):
    from rouge_score import rouge_scorer  # imports nltk: about a second, paid once, and only by ROUGE users

    return rouge_scorer.RougeScorer([rouge_type], use_stemmer=False)
