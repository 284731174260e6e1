"""Replies held to a JSON schema (``response_format``) on the tiny random Llama: whatever a random model would write,
every reply of a batch parses and validates against its schema, ends when its document does, and reports the model's
own logprobs; malformed schemas and schemas past the compile limits are refused before any model work; RULER's exact
verdict schema gives a verdict that RULER's matching accepts."""

from __future__ import annotations

import json
import re

import art
import jsonschema
import pytest

from judges.ruler import SCORE_GRID, apply_scores, exact_verdict_format
from service.backends.transformers import chat
from service.backends.transformers.generation import Generator, SamplingRequest
from service.backends.transformers.structured import StructureError, grammar_for

STRING = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string literal
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "reason": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 2},
    },
    "required": ["verdict", "count", "reason", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def lm(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_lm)
    return AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval(), tokenizer


def _sample(lm, response_format: dict, *, n: int, max_tokens: int = 200, temperature: float = 1.0):
    model, tokenizer = lm
    generator = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer))
    prompt = tuple(tokenizer.encode("Grade the answer. Reply in JSON."))
    request = SamplingRequest(prompt_ids=prompt, n=n, max_tokens=max_tokens, seed=5, temperature=temperature,
                              grammar=grammar_for(response_format))  # fmt: skip
    [samples] = generator.generate([request])
    return samples


def test_every_reply_of_a_random_model_is_a_document_its_schema_accepts(lm):
    samples = _sample(lm, {"type": "json_schema", "json_schema": {"name": "grade", "schema": SCHEMA}}, n=6)
    documents = [json.loads(s.text) for s in samples]
    for document in documents:
        jsonschema.validate(document, SCHEMA)
    assert all(s.finish_reason == "stop" for s in samples)  # the end token, once the document closed
    assert len({json.dumps(d, sort_keys=True) for d in documents}) > 1  # sampled, not one forced text
    assert not any(re.search(r"\s", STRING.sub("", s.text)) for s in samples)  # compact: no whitespace between tokens
    # the model's own logprobs, unmasked: a token the grammar forced (`{"verdict":"` opens every reply) was not
    # certain to the model
    assert all(max(s.logprobs[:3]) < -1.0 for s in samples)

    [greedy] = _sample(lm, {"type": "json_object"}, n=1, temperature=0)
    assert isinstance(json.loads(greedy.text), dict) and greedy.finish_reason == "stop"


def test_rulers_exact_verdict_schema_gives_a_verdict_its_matching_accepts(lm):
    from art.rewards.ruler import Response

    [sample] = _sample(lm, exact_verdict_format(3), n=1, max_tokens=400)
    verdict = Response.model_validate_json(sample.text)
    group = art.TrajectoryGroup([
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=float(i)) for i in range(3)
    ])  # fmt: skip
    scored, _ = apply_scores(group, verdict.scores)
    assert all(t.reward in SCORE_GRID for t in scored.trajectories)
    assert all(len(s.explanation) <= 300 for s in verdict.scores)


@pytest.mark.parametrize("response_format", [None, {"type": "text"}])
def test_free_text_has_no_grammar(response_format):
    assert grammar_for(response_format) is None


@pytest.mark.parametrize(
    ("response_format", "refusal"),
    [
        ("json", "an object is expected"),
        ({"type": "xml"}, "one of text, json_object, json_schema"),
        ({"type": "json_schema"}, "a JSON schema object is expected"),
        ({"type": "json_schema", "json_schema": {"schema": ["not", "a", "schema"]}}, "a JSON schema object"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}, "cannot be followed here"),
        ({"type": "json_schema", "json_schema": {"schema": {"enum": [str(i) * 50 for i in range(20_000)]}}},
         "too big"),
    ],
)
def test_a_malformed_or_oversized_schema_is_refused_before_any_model_work(response_format, refusal):
    nested: dict = {"type": "object"}
    for _ in range(3_000):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    with pytest.raises(StructureError, match=refusal):
        grammar_for(response_format)
    with pytest.raises(StructureError, match="cannot be followed here"):
        grammar_for({"type": "json_schema", "json_schema": {"schema": nested}})


def test_a_matcher_that_failed_masks_nothing_and_ends_its_reply(lm):
    """A matcher in error (here: fed a token its grammar refuses, as a limit passed mid-reply would leave it) masks
    nothing, so the draw stays defined, and says it failed, so the sampler ends the reply."""
    import torch

    from service.backends.transformers.structured import Guide

    _, tokenizer = lm
    guide = Guide(tokenizer, vocab_size=len(tokenizer), end_token_ids=chat.end_token_ids(tokenizer))
    matcher = guide.matcher(grammar_for({"type": "json_object"}))
    opening = torch.zeros(len(tokenizer))
    matcher.mask(opening)
    assert 0 < int(torch.isfinite(opening).sum()) < len(tokenizer) and not matcher.failed
    matcher.advance(tokenizer.encode("x")[0])  # a JSON object cannot start with x
    logits = torch.zeros(len(tokenizer))
    matcher.mask(logits)
    assert matcher.failed and bool(torch.isfinite(logits).all())
