"""The math levels: committed splits and fingerprints, answers recomputed from the questions, disjoint
splits, worked examples that are right and held out of val and test, demonstrations for every level."""

from __future__ import annotations

import json
import re

import pytest

from environments import EnvironmentConfigError, load
from environments.math import MathEnvironment
from environments.math import scenarios as scenario_files
from environments.math.env import FEW_SHOT
from environments.math.scorer import score
from service import manifests
from service.spec import JobSpec

LEVELS = tuple(scenario_files.LEVELS)
# The default level's splits as they were before levels existed: manifests of earlier runs still hold.
CARRY_FREE_FINGERPRINTS = {
    "test": "sha256:b4b488375c401ccff9247489694acee6de83628340e357f5665039011d820566",
    "train": "sha256:e240d940355f90a72bc57e3aa0518bbae7dcd8b58450a6a7a1c741e69fe7d128",
    "val": "sha256:20437f1f34e229e6b8a6aa4c187ac415ede06d1542a6d5ea0c36ad9d4cdab6b4",
}

N = r"(\d+)"
ADDITION = (rf"What is {N} \+ {N}\?", rf"Compute {N} \+ {N}\.", rf"How many \w+ in all\? \w+ has {N}, \w+ has {N}\.")


def _match(prompt: str, patterns) -> tuple[int, re.Match]:
    for index, pattern in enumerate(patterns):
        if (found := re.fullmatch(pattern, prompt)) is not None:
            return index, found
    raise AssertionError(f"no template of the level reads {prompt!r}")


def solve(level: str, prompt: str) -> tuple[tuple, int]:
    """The problem's key and answer, worked out from the question's words alone."""
    if level in ("carry_free", "carries"):
        _, m = _match(prompt, ADDITION)
        a, b = int(m[1]), int(m[2])
        carry = a % 10 + b % 10 >= 10 or a // 10 + b // 10 >= 10
        assert carry == (level == "carries") and 0 <= a <= 99 and 0 <= b <= 99
        return ((a, b) if level == "carry_free" else tuple(sorted((a, b)))), a + b
    if level == "subtraction":
        index, m = _match(prompt, (rf"What is {N} - {N}\?", rf"Compute {N} - {N}\.", rf"Subtract {N} from {N}\."))
        a, b = (int(m[2]), int(m[1])) if index == 2 else (int(m[1]), int(m[2]))
        return (a, b), a - b
    if level == "multiplication":
        _, m = _match(prompt, (rf"What is {N} \* {N}\?", rf"Compute {N} x {N}\.",
                               rf"\w+ has {N} bags of {N} (\w+)\. How many \3 in all\?"))  # fmt: skip
        a, b = sorted((int(m[1]), int(m[2])))
        assert 2 <= a <= 12 and 2 <= b <= 99
        return (a, b), a * b
    index, m = _match(prompt, (
        rf"(\w+) has {N} (\w+), buys {N} more and gives away {N}\. How many \3 does \1 have now\?",
        rf"(\w+) has {N} (\w+), gives {N} to \w+ and then finds {N}\. How many \3 does \1 have now\?",
        rf"\w+ has {N} (\w+)\. \w+ has {N} more\. How many \2 do they have together\?",
        rf"\w+ buys {N} bags of {N} (\w+) and gives away {N}\. How many \3 are left\?",
    ))  # fmt: skip
    if index == 0:
        a, b, c = int(m[2]), int(m[4]), int(m[5])
        return ("a+b-c", a, b, c), a + b - c
    if index == 1:
        a, c, b = int(m[2]), int(m[4]), int(m[5])
        assert c <= a  # one cannot give away more than one has
        return ("a+b-c", a, b, c), a - c + b
    if index == 2:
        a, b = int(m[1]), int(m[3])
        return ("a+(a+b)", a, b, 0), a + (a + b)
    a, b, c = int(m[1]), int(m[2]), int(m[4])
    return ("a*b-c", a, b, c), a * b - c


@pytest.mark.parametrize("level", LEVELS)
def test_committed_splits_are_what_the_generator_makes_and_match_their_fingerprints(level):
    directory = scenario_files.LEVELS[level].directory
    committed_fingerprints = json.loads((directory / "fingerprints.json").read_text())
    for split, rows in scenario_files.generate_splits(level).items():
        assert (directory / f"{split}.jsonl").read_bytes() == scenario_files.canonical_bytes(rows), f"{level} {split}"
        assert committed_fingerprints[split] == scenario_files.fingerprint(rows)
    assert MathEnvironment(level=level).fingerprints() == committed_fingerprints


def test_the_default_level_is_the_carry_free_tier_byte_for_byte():
    assert MathEnvironment().level == "carry_free" == scenario_files.DEFAULT_LEVEL
    assert MathEnvironment().fingerprints() == CARRY_FREE_FINGERPRINTS
    assert MathEnvironment().scenarios("val")[0]["id"] == "math-val-00000"


@pytest.mark.parametrize("level", LEVELS)
def test_every_answer_is_right_and_the_splits_share_no_problem(level):
    env = MathEnvironment(level=level)
    splits = {split: env.scenarios(split) for split in ("train", "val", "test")}
    assert len(splits["val"]) >= 200 and len(splits["test"]) >= 200 and len(splits["train"]) >= 2000
    ids = [row["id"] for rows in splits.values() for row in rows]
    assert len(ids) == len(set(ids)) and all(i.startswith(scenario_files.LEVELS[level].id_prefix + "-") for i in ids)
    keys = {}
    for split, rows in splits.items():
        keys[split] = []
        for row in rows:
            key, answer = solve(level, row["prompt"])
            assert row["expected_answer"] == answer and type(answer) is int, row
            keys[split].append(key)
    assert len(set(keys["val"])) == len(keys["val"]) and len(set(keys["test"])) == len(keys["test"])
    assert not set(keys["train"]) & set(keys["val"]) and not set(keys["train"]) & set(keys["test"])
    assert not set(keys["val"]) & set(keys["test"])


def test_subtraction_has_negative_answers_and_the_strict_scorer_takes_them():
    rows = [row for row in MathEnvironment(level="subtraction").scenarios("val") if row["expected_answer"] < 0]
    assert len(rows) > 50
    for row in rows:
        magnitude = -row["expected_answer"]
        assert score(row, f"Final: -{magnitude}")["details"]["outcome"] == "correct"
        assert score(row, f"Final: {magnitude}")["details"]["outcome"] == "wrong_answer"
        assert score(row, f"Final: -0{magnitude}")["details"]["outcome"] == "leading_zeros"
        assert score(row, f"Final: \u2212{magnitude}")["details"]["outcome"] == "not_integer"  # a typographic minus


def test_every_level_has_its_own_fingerprints_and_the_manifest_locks_them():
    fingerprints = {level: MathEnvironment(level=level).fingerprints() for level in LEVELS}
    every = [value for prints in fingerprints.values() for value in prints.values()]
    assert len(set(every)) == len(every)
    spec = JobSpec(environment="math", environment_args={"level": "subtraction"})
    manifest = manifests.training_manifest(spec, load("math", spec.environment_args))
    assert manifest["locked"]["split_fingerprint"] == fingerprints["subtraction"]["val"]
    assert manifest["locked"]["environment_args"] == {"level": "subtraction"}
    assert manifest["fingerprints"] == fingerprints["subtraction"]


@pytest.mark.parametrize("level", ["calculus", "", "Carries", 3, None, ["carries"]])
def test_an_unknown_level_is_refused_naming_the_levels(level):
    named = "carry_free, carries, subtraction, multiplication, word_problems"
    with pytest.raises(ValueError, match=f"unknown math level .*; levels are {named}"):
        MathEnvironment(level=level)
    with pytest.raises(EnvironmentConfigError, match=f"environment 'math': unknown math level .*; levels are {named}"):
        load("math", {"level": level})


@pytest.mark.parametrize("level", LEVELS)
def test_the_worked_examples_are_right_and_none_is_a_val_or_test_problem(level):
    env = MathEnvironment(level=level)
    held_out = {solve(level, row["prompt"])[0] for split in ("val", "test") for row in env.scenarios(split)}
    assert len(FEW_SHOT[level]) == 2
    for question, reply in FEW_SHOT[level]:
        key, answer = solve(level, question)
        assert reply == f"Final: {answer}" and score({"expected_answer": answer}, reply)["reward"] == 1.0
        assert key not in held_out


@pytest.mark.parametrize("level", LEVELS)
def test_demonstrations_of_every_level_open_like_rollouts_and_are_sloppy(level):
    env = MathEnvironment(level=level)
    rows = {row["prompt"]: row for row in env.scenarios("train")}
    demos = env.demonstrations(seed=3, count=800)
    outcomes = []
    for demo in demos:
        *opening, reply = demo.messages_and_choices
        row = rows[opening[-1]["content"]]
        assert opening == env.opening(row)
        outcomes.append(score(row, reply["content"])["details"]["outcome"])
    assert 0.58 < outcomes.count("correct") / len(outcomes) < 0.76
    assert {"wrong_answer", "missing_prefix", "extra_whitespace", "leading_zeros", "not_integer"} <= set(outcomes)
