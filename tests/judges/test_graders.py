"""Graders on the real libraries, real child processes and a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping

import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz import fuzz
from rouge_score import rouge_scorer

from judges.graders import CodeGraders, GraderConfigError, GradeResult, GraderRegistry, build_grader, sample_from_text
from tests.judges import grader_functions
from tests.judges.judge_server import Behaviour, judge_server

# litellm leaves its logging coroutines pending when a test's loop closes; nothing of ours is at stake
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'Logging.async_success_handler' was never awaited")

OUTPUT = "{{sample.output_text}}"
ANSWER = "{{item.answer}}"
FUNCTIONS = "tests.judges.grader_functions"
DEFINED = [name for name, value in vars(grader_functions).items() if getattr(value, "__module__", None) == FUNCTIONS]
REGISTERED = [f"{FUNCTIONS}:{name}" for name in [*DEFINED, "no_such_function"]]
CODE = CodeGraders(GraderRegistry.load(REGISTERED))  # as an operator's ARTSVC_GRADER_FUNCTIONS registers them


async def grade(config: dict, output_text: str, item: object = None, **build) -> GradeResult:
    grader = build_grader(config, **{"code": CODE, **build})
    return await grader.grade(sample_from_text(output_text), item)


def string_check(operation: str, name: str = "check", reference: str = ANSWER) -> dict:
    return {"type": "string_check", "name": name, "input": OUTPUT, "reference": reference, "operation": operation}


def similarity(metric: str, name: str = "similar", **extra) -> dict:
    return {"type": "text_similarity", "name": name, "input": OUTPUT, "reference": ANSWER,
            "evaluation_metric": metric, **extra}  # fmt: skip


def python(function: str, name: str = "fn", **extra) -> dict:
    return {"type": "python", "name": name, "function": f"{FUNCTIONS}:{function}", **extra}


def is_error(result: GradeResult, *words: str) -> bool:
    error = result.details.get("error", "")
    return result.reward == 0.0 and bool(error) and all(word in error for word in words)


# string_check


@pytest.mark.parametrize(
    ("operation", "output", "answer", "reward"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),
        ("eq", "Paris ", "Paris", 0.0),  # nothing is stripped
        ("ne", "Lyon", "Paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is paris.", "Paris", 0.0),
        ("ilike", "THE CAPITAL IS PARIS.", "Paris", 1.0),
        ("ilike", "DIE STRASSE", "straße", 1.0),  # Unicode case folding
        ("ilike", "The capital is Lyon.", "Paris", 0.0),
    ],
)
@pytest.mark.asyncio
async def test_string_check_operations(operation, output, answer, reward):
    result = await grade(string_check(operation), output, {"answer": answer})
    assert result.reward == reward
    assert result.details["grader"] == "check" and result.details["version"] == "string_check-1.0.0"
    assert operation in result.details["reason"] and "error" not in result.details


@pytest.mark.asyncio
async def test_templates_reach_nested_fields_and_render_non_strings_as_json():
    nested = {**string_check("eq", reference="{{item.answers.1}}"), "input": "{{sample.output_json.city.name}}"}
    assert (await grade(nested, '{"city": {"name": "Paris"}}', {"answers": ["Lyon", "Paris"]})).reward == 1.0
    assert (await grade(string_check("eq"), "4", {"answer": 4})).reward == 1.0
    assert (await grade(string_check("eq"), '["a", 1]', {"answer": ["a", 1]})).reward == 1.0


@pytest.mark.parametrize(
    ("config", "output", "item", "words"),
    [
        (string_check("eq"), "Paris", {}, ["item has no field 'answer'"]),
        (string_check("eq"), "Paris", {"answer": None}, ["{{item.answer}} is null"]),
        (string_check("eq", reference="{{item.answer.2}}"), "x", {"answer": ["a"]}, ["1 elements, no index 2"]),
        (string_check("eq", reference="{{sample.output_json.city}}"), "not JSON", {}, ["null"]),
        (string_check("eq"), "Paris", "not a dict", ["item is str"]),
        (string_check("eq"), "Paris", None, ["item is null, which has no field 'answer'"]),
    ],
)
@pytest.mark.asyncio
async def test_a_reference_that_does_not_resolve_is_an_error_result(config, output, item, words):
    assert is_error(await grade(config, output, item), *words)


@pytest.mark.asyncio
async def test_grading_never_raises_even_when_the_sample_itself_raises():
    class Hostile(Mapping):
        def __getitem__(self, key):
            raise RuntimeError("boom")

        def __iter__(self):
            return iter(["output_text"])

        def __len__(self):
            return 1

    result = await build_grader(string_check("eq")).grade(Hostile(), {"answer": "x"})
    assert is_error(result, "internal error", "RuntimeError: boom")


# text_similarity

ROUGE = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_l": "rougeL"}


def library_score(metric: str, text: str, reference: str) -> float:
    if metric == "fuzzy_match":
        return fuzz.ratio(text, reference) / 100
    if metric == "bleu":
        return sacrebleu.sentence_bleu(text, [reference]).score / 100
    rouge_type = ROUGE[metric]
    return rouge_scorer.RougeScorer([rouge_type]).score(reference, text)[rouge_type].fmeasure


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_l"])
@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("the cat sat on the mat", "the cat is sitting on the mat"),
        ("a quick brown fox jumps over the lazy dog", "the quick brown fox jumped over a lazy dog"),
    ],
)
@pytest.mark.asyncio
async def test_text_similarity_is_the_library_score(metric, text, reference):
    result = await grade(similarity(metric), text, {"answer": reference})
    assert result.reward == pytest.approx(library_score(metric, text, reference))
    assert 0.0 < result.reward < 1.0 and result.details["metric"] == metric and "passed" not in result.details


@pytest.mark.asyncio
async def test_identical_texts_score_one_even_where_bleu_rounds_above_it():
    for metric in ("fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_l"):
        assert (await grade(similarity(metric), "the cat sat down", {"answer": "the cat sat down"})).reward == 1.0


@pytest.mark.asyncio
async def test_pass_threshold_says_whether_the_score_passed():
    text, reference = "the cat sat on the mat", "the cat is sitting on the mat"
    score = fuzz.ratio(text, reference) / 100
    passed = await grade(similarity("fuzzy_match", pass_threshold=score - 0.01), text, {"answer": reference})
    failed = await grade(similarity("fuzzy_match", pass_threshold=score + 0.01), text, {"answer": reference})
    assert passed.details["passed"] is True and failed.details["passed"] is False
    assert passed.reward == failed.reward == pytest.approx(score)


@pytest.mark.asyncio
async def test_a_text_too_long_for_the_metrics_is_an_error_result():
    result = await grade(similarity("rouge_l"), "word " * 5000, {"answer": "word"})
    assert is_error(result, "input has 25000 characters")


# python


@pytest.mark.asyncio
async def test_python_grader_runs_a_registered_function():
    assert (await grade(python("exact"), " 42 ", {"answer": 42})).reward == 1.0
    result = await grade(python("exact"), "41", {"answer": 42})
    assert result.reward == 0.0 and "error" not in result.details and result.details["version"] == "python-1.1.0"


@pytest.mark.asyncio
async def test_python_grader_keeps_the_functions_details_and_ignores_its_prints():
    result = await grade(python("with_details"), "four", {})
    assert result.reward == 0.25 and result.details["function_details"] == {"length": 4}


@pytest.mark.asyncio
async def test_python_grader_clamps_a_reward_outside_0_1_and_says_so():
    result = await grade(python("too_high"), "x", {})
    assert result.reward == 1.0 and result.details["raw_reward"] == 3.0 and result.details["clamped"] is True


@pytest.mark.parametrize(
    ("function", "words"),
    [
        ("raises", ["ValueError: no answer here"]),
        ("not_a_number", ["returned nan, not a finite number"]),
        ("a_word", ["returned 'high', not a finite number"]),
        ("no_such_function", ["AttributeError", "no_such_function"]),  # registered, but the module has no such function
    ],
)
@pytest.mark.asyncio
async def test_a_python_function_that_fails_is_an_error_result(function, words):
    assert is_error(await grade(python(function), "x", {}), *words)


@pytest.mark.asyncio
async def test_a_python_function_that_hangs_is_killed_at_its_timeout():
    started = time.monotonic()
    result = await grade(python("hangs", timeout_s=1), "x", {})
    assert is_error(result, "did not return within 1.0 s")
    assert time.monotonic() - started < 5


@pytest.mark.asyncio
async def test_python_grader_needs_json():
    assert is_error(await grade(python("exact"), "x", {"answer": {1, 2}}), "must be JSON")


# score_model


def score_model(model: str = "openai/gpt-4o-mini", lo: float = 0, hi: float = 10) -> dict:
    return {"type": "score_model", "name": "judge", "model": model, "range": [lo, hi],
            "input": [{"role": "user", "content": f"Question: {{{{item.question}}}}\nAnswer: {OUTPUT}"}],
            "sampling_params": {"temperature": 0, "max_tokens": 8}}  # fmt: skip


async def judged(script: list[Behaviour], config: dict | None = None) -> tuple[GradeResult, list[dict]]:
    with judge_server(script) as server:
        params = {"api_base": server.api_base, "api_key": "test", "max_retries": 0}
        result = await grade(config or score_model(), "Paris", {"question": "Capital of France?"},
                       allowed_models={"openai/gpt-4o-mini"}, litellm_params=params)  # fmt: skip
    return result, server.requests


@pytest.mark.asyncio
async def test_score_model_maps_the_models_number_onto_0_1_and_counts_tokens_and_cost():
    result, requests = await judged([Behaviour(body="7")])
    assert result.reward == pytest.approx(0.7) and result.details["raw_score"] == 7.0
    assert result.details["prompt_tokens"] > 0 and isinstance(result.details["completion_tokens"], int)
    assert result.details["cost_usd"] > 0 and "clamped" not in result.details  # priced from litellm's local map
    (request,) = requests
    assert request["temperature"] == 0 and request["max_tokens"] == 8
    assert request["messages"][0] == {"role": "system", "content": "Reply with only a number from 0 to 10: the score. "
                                      "No other text."}  # fmt: skip
    assert request["messages"][1] == {"role": "user", "content": "Question: Capital of France?\nAnswer: Paris"}


@pytest.mark.asyncio
async def test_score_model_reads_a_json_score_and_clamps_one_outside_the_range():
    assert (await judged([Behaviour(body='{"score": 2.5}')]))[0].reward == pytest.approx(0.25)
    result = (await judged([Behaviour(body="Score: 15 out of 10")]))[0]
    assert result.reward == 1.0 and result.details["raw_score"] == 15.0 and result.details["clamped"] is True


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        (Behaviour(body="I would rather not say."), ["no finite score in the reply"]),
        (Behaviour(body='{"verdict": 9}'), ["no finite score"]),
        (Behaviour(status=500), ["the call to openai/gpt-4o-mini failed", "InternalServerError"]),
    ],
)
@pytest.mark.asyncio
async def test_a_failed_model_call_or_an_unreadable_reply_is_an_error_result(behaviour, words):
    assert is_error((await judged([behaviour]))[0], *words)


def test_a_model_the_operator_did_not_allow_is_a_config_error():
    with pytest.raises(GraderConfigError, match=r"^model: model 'openai/gpt-5' is not allowed"):
        build_grader(score_model("openai/gpt-5"), allowed_models={"openai/gpt-4o-mini"})


# multi


def multi(formula: str, **graders: dict) -> dict:
    graders = graders or {"exact": string_check("eq", "exact"), "fuzzy": similarity("fuzzy_match", "fuzzy")}
    return {"type": "multi", "name": "combined", "graders": graders, "calculate_output": formula}


@pytest.mark.asyncio
async def test_multi_combines_its_parts_with_the_formula():
    result = await grade(multi("0.5 * exact + 0.5 * fuzzy"), "Paris!", {"answer": "Paris"})
    fuzzy = fuzz.ratio("Paris!", "Paris") / 100
    assert result.reward == pytest.approx(0.5 * 0 + 0.5 * fuzzy)
    assert result.details["parts"]["exact"]["reward"] == 0.0 and result.details["parts"]["fuzzy"]["reward"] == fuzzy
    assert result.details["version"] == "multi-1.1.0(exact=string_check-1.0.0,fuzzy=text_similarity-1.0.0)"
    assert (await grade(multi("min(1, max(exact, fuzzy) * 2)"), "Paris!", {"answer": "Paris"})).reward == 1.0


@pytest.mark.asyncio
async def test_a_failing_part_counts_zero_and_is_reported():
    config = multi("0.5 * exact + 0.5 * fn", exact=string_check("eq", "exact"), fn=python("raises"))
    result = await grade(config, "Paris", {"answer": "Paris"})
    assert result.reward == 0.5 and "error" not in result.details
    assert "ValueError: no answer here" in result.details["part_errors"]["fn"]
    assert is_error(await grade(config, "Paris", {}), "no part could grade")  # every part failed: not a silent 0


@pytest.mark.asyncio
async def test_multi_clamps_its_result_and_reports_a_formula_that_fails():
    result = await grade(multi("exact + fuzzy"), "Paris", {"answer": "Paris"})
    assert result.reward == 1.0 and result.details["raw_reward"] == 2.0 and result.details["clamped"] is True
    assert is_error(await grade(multi("exact / (fuzzy - 1)"), "Paris", {"answer": "Paris"}), "ZeroDivisionError")


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        ("exact + rouge", "'rouge' is not one of the graders ['exact', 'fuzzy']"),
        ("exact.real", "Attribute is not allowed"),
        ("__import__('os')", "only min, max, abs can be called"),
        ("'a' * 3", "'a' is not a number"),
        ("x = exact", "not an expression"),
    ],
)
def test_a_formula_outside_the_grammar_is_a_config_error(formula, words):
    with pytest.raises(GraderConfigError, match=r"^calculate_output: ") as raised:
        build_grader(multi(formula))
    assert words in str(raised.value)


# config validation


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"name": "x"}, "type"),
        ({**string_check("eq"), "type": "regex"}, "type"),
        ({**string_check("eq"), "operation": "contains"}, "operation"),
        ({**string_check("eq"), "name": ""}, "name"),
        ({**string_check("eq"), "input": "{{smaple.output_text}}"}, "input"),
        ({**string_check("eq"), "weight": 2}, "weight"),
        (similarity("meteor"), "evaluation_metric"),
        (similarity("bleu", pass_threshold=1.5), "pass_threshold"),
        (python("exact", timeout_s=61), "timeout_s"),
        (python("exact") | {"function": "import os"}, "function"),
        ({**score_model(), "range": [1, 1]}, "range"),
        ({**score_model(), "sampling_params": {"top_k": 3}}, "sampling_params.top_k"),
        (multi("exact", exact=string_check("equals")), "graders.exact.operation"),
        (multi("min", min=string_check("eq")), "graders"),
    ],
)
def test_config_errors_name_the_field(config, field):
    with pytest.raises(GraderConfigError) as raised:
        build_grader(config)
    assert str(raised.value).startswith(f"{field}: ") or f"; {field}: " in str(raised.value)


def test_sample_from_text_parses_only_json_objects():
    assert sample_from_text('{"a": 1}') == {"output_text": '{"a": 1}', "output_json": {"a": 1}}
    assert sample_from_text("[1]")["output_json"] is None and sample_from_text("Paris")["output_json"] is None


# totality

TEXT_GRADERS = [build_grader(string_check(op, name=op)) for op in ("eq", "ne", "like", "ilike")] + [
    build_grader(similarity(metric, name=metric)) for metric in ("fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_l")
]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=8)  # fmt: skip


@pytest.mark.asyncio
@settings(max_examples=100, deadline=None)
@given(output=st.text(), answer=JSON, item_is_dict=st.booleans())
async def test_text_graders_never_raise_and_stay_in_0_1(output, answer, item_is_dict):
    item = {"answer": answer} if item_is_dict else answer
    for result in await asyncio.gather(*(g.grade(sample_from_text(output), item) for g in TEXT_GRADERS)):
        assert 0.0 <= result.reward <= 1.0
        assert {"grader", "version", "reason"} <= result.details.keys()
        json.dumps(result.details)  # details are JSON, ready to store
