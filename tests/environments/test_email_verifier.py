"""The email verdict (verify) and the training reward (shaped_reward)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from environments.email.verifier import (
    MAX_CITATIONS,
    OUTCOMES,
    SCORER_VERSION,
    normalize,
    shaped_reward,
    verify,
)

MONEY = {"id": "q1", "answer": "$1,200.00", "source_ids": ["a012"]}
CODE = {"id": "q2", "answer": "QX7P2L", "source_ids": ["b101"]}
TWO_HOPS = {"id": "q3", "answer": "1ZCAK6HBSM", "source_ids": ["d179", "d182"]}
TIME = {"id": "q4", "answer": "09:30", "source_ids": ["c007"]}
NAME = {"id": "q5", "answer": "Lena Park", "source_ids": ["a300"]}


def outcome(scenario, answer, source_ids) -> str:
    result = verify(scenario, answer, source_ids)
    details = result["details"]
    assert set(result) == {"reward", "details"} and details["outcome"] in OUTCOMES
    assert details["scorer_version"] == SCORER_VERSION and isinstance(details["reason"], str) and details["reason"]
    assert result["reward"] == (1.0 if details["outcome"] == "correct" else 0.0)
    return details["outcome"]


def test_exact_answers_and_form_variants_are_correct():
    for answer in ("$1,200.00", "1200", "1,200", "$1200", "1200.0", "USD 1200", "1200 usd", " $1,200.00. ", "$1,200"):
        assert outcome(MONEY, answer, ["a012"]) == "correct", answer
    for answer in ("QX7P2L", "qx7p2l", " QX7P2L.", '"QX7P2L"', "(qx7p2l)", "ＱＸ７Ｐ２Ｌ"):
        assert outcome(CODE, answer, ["b101"]) == "correct", answer
    for answer in ("09:30", "9:30", "9:30."):
        assert outcome(TIME, answer, ["c007"]) == "correct", answer
    for answer in ("Lena Park", "lena   park", "LENA PARK!"):
        assert outcome(NAME, answer, ["a300"]) == "correct", answer
    assert outcome(TWO_HOPS, "1zcak6hbsm", ["d182", "d179"]) == "correct"
    assert outcome(CODE, "QX7P2L", ["b101", "b101", "b102", "b103"]) == "correct"  # repeats count once


def test_paraphrases_and_near_misses_are_wrong():
    for answer in ("1200.01", "120", "12,00", "$1,200 (corrected)", "about 1200", "1.2k", "one thousand two hundred"):
        assert outcome(MONEY, answer, ["a012"]) == "wrong_answer", answer
    for answer in ("QX7P2", "QX7P2LL", "code QX7P2L", "QX7 P2L"):
        assert outcome(CODE, answer, ["b101"]) == "wrong_answer", answer
    for answer in ("9.30", "930", "09:31", "9:30 am"):
        assert outcome(TIME, answer, ["c007"]) == "wrong_answer", answer
    assert outcome(NAME, "Lena", ["a300"]) == "wrong_answer"
    assert outcome(NAME, "Park, Lena", ["a300"]) == "wrong_answer"


def test_citations_must_cover_the_sources_and_stay_few():
    assert outcome(CODE, "QX7P2L", []) == "uncited"
    assert outcome(CODE, "QX7P2L", ["b100"]) == "uncited"  # wrongly cited
    assert outcome(TWO_HOPS, "1ZCAK6HBSM", ["d182"]) == "uncited"  # one of two sources
    over = ["b101"] + [f"b{n}" for n in range(200, 200 + MAX_CITATIONS)]
    assert outcome(CODE, "QX7P2L", over) == "too_many_citations"
    assert outcome(CODE, "QX7P2L", ["b101", "b102", "b103"]) == "correct"
    assert outcome(CODE, "WRONG", ["b101"] * 30) == "malformed"  # a list that long is not a citation list
    assert outcome(CODE, "WRONG", over) == "wrong_answer"  # the answer is judged first


def test_missing_and_malformed_answers():
    assert outcome(CODE, None, []) == "no_answer"
    assert outcome(CODE, "", ["b101"]) == "no_answer"
    assert outcome(CODE, " ... ", ["b101"]) == "no_answer"
    assert outcome(CODE, 5, ["b101"]) == "malformed"
    assert outcome(CODE, b"QX7P2L", ["b101"]) == "malformed"
    assert outcome(CODE, "QX7P2L", "b101") == "malformed"
    assert outcome(CODE, "QX7P2L", [101]) == "malformed"
    assert outcome(CODE, "QX7P2L", None) == "malformed"
    assert outcome(CODE, "x" * 1000, ["b101"]) == "malformed"

    class Sneaky(str):
        def casefold(self):
            raise RuntimeError("boom")

    assert outcome(CODE, Sneaky("QX7P2L"), ["b101"]) == "malformed"  # str subclasses run no foreign code
    for scenario in (None, {}, {"answer": "x"}, {"answer": "", "source_ids": ["a"]}, {"answer": 5, "source_ids": ["a"]},
                     {"answer": "x", "source_ids": []}, {"answer": "x", "source_ids": "a"}, ["answer"]):  # fmt: skip
        assert outcome(scenario, "x", ["a"]) == "invalid_scenario", scenario


def test_normalize():
    assert normalize("$1,200.00") == normalize("1200") == "1200"
    assert normalize("  Room   4B. ") == "room 4b"
    assert normalize("0012") == "0012"  # leading zeros are a code, not a number
    assert normalize("1,20") == "1,20"  # badly placed separators are not a number
    assert normalize("2024-05-02") == "2024-05-02"


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30), st.binary(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=15,
)


@settings(max_examples=400, deadline=None)
@given(
    scenario=st.one_of(JSONISH, st.fixed_dictionaries({"answer": JSONISH, "source_ids": JSONISH}), st.just(MONEY)),
    answer=st.one_of(JSONISH, st.text(max_size=300)),
    source_ids=st.one_of(JSONISH, st.lists(st.text(max_size=8), max_size=25)),
)
def test_verify_is_total_on_garbage(scenario, answer, source_ids):
    outcome(scenario, answer, source_ids)
    assert verify(scenario, answer, source_ids) == verify(scenario, answer, source_ids)  # deterministic


@settings(max_examples=200, deadline=None)
@given(
    sources=JSONISH,
    cited=JSONISH,
    read=JSONISH,
    invalid=st.integers(-5, 10**6),
    correct=st.booleans(),
)
def test_shaped_reward_is_total_and_bounded(sources, cited, read, invalid, correct):
    reward = shaped_reward(correct=correct, sources=sources, cited=cited, read=read, invalid_tool_calls=invalid)
    assert isinstance(reward, float) and -0.5 <= reward <= 1.3


def test_shaped_reward_orders_episodes_sensibly():
    def reward(**kw):
        base = {"correct": False, "sources": ["a1", "a2"], "cited": [], "read": [], "invalid_tool_calls": 0}
        return shaped_reward(**{**base, **kw})

    perfect = reward(correct=True, cited=["a1", "a2"], read=["a1", "a2"])
    assert perfect == 1.3
    assert reward(correct=True, cited=["a1", "a2"], read=[]) == 1.0  # guessed ids earn nothing
    assert reward(correct=True) > reward(cited=["a1", "a2"], read=["a1", "a2"]) == 0.1
    assert reward(read=["a1"]) == -0.15 and reward(read=["a1"], cited=["a1"]) == -0.05
    assert reward(invalid_tool_calls=2) == -0.3 and reward(invalid_tool_calls=100) == -0.5
    # an episode without the right answer costs the same however it ended; a right one never pays it
    assert reward() == -0.2 and reward(correct=True) == 1.0
