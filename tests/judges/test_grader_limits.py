"""Bounds on what one grader config may ask for: formulas, nesting, fan-out, templates and the replies graded, each
refused at build time naming its limit, or an error result at grade time; never an exception, never a stall."""

from __future__ import annotations

import art
import pytest

from judges.graders import GraderConfigError, GradeResult, build_grader, check_grader, sample_from_text, text_similarity
from judges.graders import multi as multi_module
from judges.grading import MAX_REPLY_CHARS, GraderJudge

EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}  # fmt: skip
FUZZY = {"type": "text_similarity", "name": "fuzzy", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "evaluation_metric": "fuzzy_match"}  # fmt: skip


def multi(formula: str, **graders: dict) -> dict:
    return {"type": "multi", "name": "combined", "graders": graders or {"exact": EXACT}, "calculate_output": formula}


def python(name: str) -> dict:
    return {"type": "python", "name": name, "function": "tests.judges.grader_functions:exact"}


def nested(depth: int) -> dict:
    config = EXACT
    for _ in range(depth):
        config = multi("exact", exact=config)
    return config


async def grade(config: dict, output: str = "Paris", item: object = None) -> GradeResult:
    return await build_grader(config).grade(sample_from_text(output), {"answer": "Paris"} if item is None else item)


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        ("3999999**3999999", "the exponent of ** must be a number of at most 8"),
        ("3999999 * exact", "the number 3999999 is beyond the limit of 1e+06"),
        ("-" * 30_000 + "exact", "longer than the limit of 1000 characters"),
        ("+".join(["exact"] * 20_000), "longer than the limit of 1000 characters"),
        ("+".join(["exact"] * 150), "299 parts, more than the limit of 200"),
        ("-" * 40 + "exact", "nested 41 deep, more than the limit of 32"),
        ("exact ** exact", "the exponent of ** must be a number of at most 8"),
        ("exact ** 9", "the exponent of ** must be a number of at most 8"),
        ("1e309 * exact", "the number inf is beyond the limit"),
        ("exact << 2", "LShift is not allowed"),
        ("exact | 1", "BitOr is not allowed"),
    ],
)
def test_a_formula_past_a_bound_is_a_config_error_naming_it(formula, words):
    with pytest.raises(GraderConfigError, match=r"^calculate_output: ") as raised:
        build_grader(multi(formula))
    assert words in str(raised.value)


@pytest.mark.asyncio
async def test_a_formula_within_the_bounds_is_evaluated_in_floating_point():
    assert (await grade(multi("min(1, exact ** 2 * 0.5 + 2 ** -1)"))).reward == 1.0
    assert (await grade(multi("7 // 2 / 4"))).reward == 0.75
    result = await grade(multi("max(exact, ((1000 ** 8) ** 8) ** 8)"))
    assert result.reward == 0.0 and result.details["error"].startswith("calculate_output failed: ")
    result = await grade(multi(" * ".join(["1000000 ** 8"] * 7)))  # 1e336: inf in floating point
    assert result.details["error"].startswith("calculate_output gave inf, not a finite number")


@pytest.mark.asyncio
async def test_formula_and_metric_run_off_the_loop_under_a_time_limit(monkeypatch):
    monkeypatch.setattr(multi_module, "FORMULA_TIMEOUT_S", 0)
    monkeypatch.setattr(text_similarity, "METRIC_TIMEOUT_S", 0)
    assert "calculate_output took more than 0 s" in (await grade(multi("exact"))).details["error"]
    assert "fuzzy_match took more than 0 s" in (await grade(FUZZY)).details["error"]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (nested(200), "multi graders nested more than 3 deep"),
        (nested(4), "multi graders nested more than 3 deep"),
        (multi("a", **{f"a{i}": EXACT for i in range(16)}), "more than 16 graders in one tree"),
        (multi("p0", **{f"p{i}": python(f"p{i}") for i in range(5)}), "more than 4 python graders in one tree"),
        ({**EXACT, "input": [[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]}, "a value nested more than 12 deep"),
        ({**EXACT, "reference": "x" * 4001}, "reference: longer than the limit of 4000 characters"),
        ({**EXACT, "name": "n" * 65}, "name: String should have at most 64 characters"),
    ],
)
def test_a_tree_past_a_bound_is_a_config_error_naming_it(config, words):
    with pytest.raises(GraderConfigError) as raised:
        check_grader(config)
    assert words in str(raised.value)


def test_trees_at_the_bounds_are_accepted():
    check_grader(nested(3))
    check_grader(multi("a0", **{f"a{i}": EXACT for i in range(15)}))
    check_grader(multi("p0", **{f"p{i}": python(f"p{i}") for i in range(4)}))


@pytest.mark.asyncio
async def test_a_template_that_renders_too_long_is_an_error_result():
    config = {**EXACT, "reference": "{{sample.output_text}}" * 100}
    result = await grade(config, output="x" * 2_000)
    assert "the template renders to more than the limit of 100000 characters" in result.details["error"]


@pytest.mark.asyncio
async def test_a_reply_too_long_to_grade_drops_its_group_with_the_reason():
    def trajectory(reply: str) -> art.Trajectory:
        return art.Trajectory(messages_and_choices=[{"role": "user", "content": "Capital?"},
                                                    {"role": "assistant", "content": reply}])  # fmt: skip

    judge = GraderJudge(build_grader(EXACT), {"s": {"answer": "Paris"}}, concurrency=2)
    long = "x" * (MAX_REPLY_CHARS + 1)
    group = art.TrajectoryGroup([trajectory("Paris"), trajectory(long)], metadata={"scenario_id": "s"})
    judged = await judge.judge(group)
    assert judged.group is None and f"more than the limit of {MAX_REPLY_CHARS}" in judged.failure
    pair = [trajectory("Paris"), trajectory("Lyon")]
    fine = await judge.judge(art.TrajectoryGroup(pair, metadata={"scenario_id": "s"}))
    assert [t.reward for t in fine.group.trajectories] == [1.0, 0.0]
