"""The math environment's data and demonstrations (its scorer has its own test file)."""

import json

from environments import load
from environments.math import MathEnvironment
from environments.math import scenarios as scenario_files
from environments.math.scorer import score


def test_committed_splits_are_what_the_generator_makes_and_match_their_fingerprints():
    generated = scenario_files.generate_splits()
    fingerprints = json.loads((scenario_files.SCENARIO_DIR / "fingerprints.json").read_text())
    for split, rows in generated.items():
        committed = (scenario_files.SCENARIO_DIR / f"{split}.jsonl").read_bytes()
        assert committed == scenario_files.canonical_bytes(rows), f"{split}.jsonl differs from the generator"
        assert fingerprints[split] == scenario_files.fingerprint(rows)


def test_split_sizes_ids_and_disjointness():
    env = MathEnvironment()
    train, val, test = (env.scenarios(s) for s in ("train", "val", "test"))
    assert len(val) >= 200 and len(test) >= 200 and len(train) > 1000
    ids = [r["id"] for r in (*train, *val, *test)]
    assert len(ids) == len(set(ids))

    def pair(row):
        numbers = [int(tok.strip("?.,")) for tok in row["prompt"].split() if tok.strip("?.,").isdigit()]
        assert sum(numbers) == row["expected_answer"]
        return tuple(numbers)

    train_pairs = {pair(r) for r in train}
    assert not train_pairs & {pair(r) for r in val}
    assert not train_pairs & {pair(r) for r in test}
    assert {pair(r) for r in val}.isdisjoint({pair(r) for r in test})


def test_every_row_is_scorable_by_its_own_answer():
    for row in MathEnvironment().scenarios("val"):
        assert score(row, f"Final: {row['expected_answer']}")["details"]["outcome"] == "correct"


def test_demonstrations_are_sloppy_in_the_stated_proportions_and_deterministic():
    env = MathEnvironment()
    demos = list(env.demonstrations(seed=1, count=4000))
    again = env.demonstrations(seed=1, count=50)
    assert [d.messages_and_choices for d in demos[:50]] == [d.messages_and_choices for d in again]
    rows = {r["prompt"]: r for r in env.scenarios("train")}
    for demo in demos[:50]:  # each opens as a rollout of its question does
        assert demo.messages_and_choices[:-1] == env.opening(rows[demo.messages_and_choices[-2]["content"]])
    outcomes = [score(rows[d.messages_and_choices[-2]["content"]], d.messages_and_choices[-1]["content"])["details"]["outcome"] for d in demos]
    correct = outcomes.count("correct") / len(outcomes)
    wrong = outcomes.count("wrong_answer") / len(outcomes)
    assert 0.62 < correct < 0.72 and 0.05 < wrong < 0.11  # 25% format slips, 8% arithmetic slips
    assert {"missing_prefix", "extra_whitespace", "not_single_line", "leading_zeros", "not_integer"} <= set(outcomes)


def test_the_environment_is_found_through_its_entry_point():
    env = load("math")
    assert env.name == "math" and env.scorer_version.startswith("math-strict")
    assert set(env.fingerprints()) == {"train", "val", "test"}
