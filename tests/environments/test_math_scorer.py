"""Tests for the strict math verifier (environments/math/scorer.py)."""

from __future__ import annotations

import sys
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.math import scorer as scorer_mod
from environments.math.scorer import (
    FORMAT_OUTCOMES,
    MAX_ANSWER_DIGITS,
    OUTCOMES,
    SCORER_NAME,
    SCORER_VERSION,
    score,
)

DETAIL_KEYS = {"outcome", "scorer_version", "parsed", "expected", "reason"}


def check_shape(result) -> str:
    """Assert the result contract and return the outcome."""
    assert type(result) is dict
    assert set(result) == {"reward", "details"}
    details = result["details"]
    assert set(details) == DETAIL_KEYS
    assert details["outcome"] in OUTCOMES
    assert details["scorer_version"] == SCORER_VERSION
    assert type(details["reason"]) is str and details["reason"]
    assert type(result["reward"]) is float
    assert result["reward"] == (1.0 if details["outcome"] == "correct" else 0.0)
    assert details["parsed"] is None or type(details["parsed"]) is int
    assert details["expected"] is None or type(details["expected"]) is int
    if details["outcome"] not in ("correct", "wrong_answer"):
        assert details["parsed"] is None
    return details["outcome"]


def outcome_of(expected_answer, completion) -> str:
    return check_shape(score({"expected_answer": expected_answer}, completion))


# --------------------------------------------------------------------------- constants


def test_constants():
    assert SCORER_VERSION == "math-strict-1.0.0"
    assert SCORER_NAME == "math_strict"
    assert OUTCOMES == (
        "correct",
        "wrong_answer",
        "missing_prefix",
        "extra_whitespace",
        "not_single_line",
        "leading_zeros",
        "not_integer",
        "invalid_example",
    )
    assert set(FORMAT_OUTCOMES) == {
        "missing_prefix",
        "extra_whitespace",
        "not_single_line",
        "leading_zeros",
        "not_integer",
    }
    assert set(FORMAT_OUTCOMES) < set(OUTCOMES)


# --------------------------------------------------------------------------- golden correct

BIG = 12345678901234567890123456789012345678901234567890
MAX_INT = int("9" * MAX_ANSWER_DIGITS)

GOLDEN_CORRECT = [
    ("Final: 42", 42),
    ("Final: 0", 0),
    ("Final: -7", -7),
    ("Final: -1234567", -1234567),
    ("Final: 1", 1),
    ("Final: 1000000", 1000000),
    (f"Final: {BIG}", BIG),
    (f"Final: -{BIG}", -BIG),
    (f"Final: {2**64}", 2**64),
    (f"Final: {MAX_INT}", MAX_INT),  # exactly MAX_ANSWER_DIGITS digits
    (f"Final: -{MAX_INT}", -MAX_INT),
    ("\n Final: 42 \n", 42),  # surrounding whitespace/newlines are stripped
    ("Final: 5 ", 5),  # trailing spaces are stripped by str.strip()
    ("Final: 5 \t", 5),
    ("\t\r\n  Final: 57\r\n\r\n", 57),
    ("\u00a0\u3000Final: 8\u2028\u2029\x85", 8),  # Unicode whitespace at the ends is stripped too
]


@pytest.mark.parametrize("completion,expected", GOLDEN_CORRECT)
def test_golden_correct(completion, expected):
    result = score({"expected_answer": expected}, completion)
    assert check_shape(result) == "correct"
    assert result["reward"] == 1.0
    assert result["details"]["parsed"] == expected
    assert result["details"]["expected"] == expected


def test_wrong_answer_details():
    result = score({"expected_answer": 57}, "Final: 56")
    assert check_shape(result) == "wrong_answer"
    assert result["reward"] == 0.0
    assert result["details"]["parsed"] == 56
    assert result["details"]["expected"] == 57
    assert result["details"]["reason"] == "answer 56 != expected 57"


# --------------------------------------------------------------------------- exploits

FIVE_THOUSAND_DIGITS = "7" * 5000

EXPLOITS = [
    # -- extra_whitespace: the separator must be exactly one U+0020
    ("Final:  5", 5, "extra_whitespace"),  # double space
    ("Final:\t5", 5, "extra_whitespace"),  # tab
    ("Final: \t5", 5, "extra_whitespace"),  # space + tab
    ("Final:\u00a05", 5, "extra_whitespace"),  # NBSP
    ("Final:\u20035", 5, "extra_whitespace"),  # em space
    ("Final:\u30005", 5, "extra_whitespace"),  # ideographic space
    ("Final: \u00a05", 5, "extra_whitespace"),  # space + NBSP
    ("Final:5", 5, "extra_whitespace"),  # no space
    ("Final:-5", -5, "extra_whitespace"),
    ("Final:", 5, "extra_whitespace"),  # nothing after the prefix
    ("Final: ", 5, "extra_whitespace"),  # strip() turns this into "Final:"
    ("Final:\u200b5", 5, "extra_whitespace"),  # zero-width space instead of a space
    # -- not_integer: after the single space, only -?[0-9]+ in ASCII
    ("Final: \uff15", 5, "not_integer"),  # fullwidth digit five
    ("Final: \u0665", 5, "not_integer"),  # Arabic-Indic five
    ("Final: \u096b", 5, "not_integer"),  # Devanagari five
    ("Final: \U0001d7d3", 5, "not_integer"),  # mathematical bold digit five
    ("Final: \u2075", 5, "not_integer"),  # superscript five
    ("Final: 4\uff12", 42, "not_integer"),  # mixed ASCII + fullwidth
    ("Final: +5", 5, "not_integer"),
    ("Final: 5.0", 5, "not_integer"),
    ("Final: 5.", 5, "not_integer"),
    ("Final: 5e1", 50, "not_integer"),
    ("Final: 1,000", 1000, "not_integer"),
    ("Final: 1_000", 1000, "not_integer"),  # int() would accept this
    ("Final: 1 000", 1000, "not_integer"),
    ("Final: --5", 5, "not_integer"),
    ("Final: -", 5, "not_integer"),
    ("Final: \u22125", -5, "not_integer"),  # U+2212 MINUS SIGN
    ("Final: 0x5", 5, "not_integer"),
    ("Final: five", 5, "not_integer"),
    ("Final: 5 apples", 5, "not_integer"),
    ("Final: 5\tFinal: 5", 5, "not_integer"),
    ("Final: (5)", 5, "not_integer"),
    ("Final: 10/2", 5, "not_integer"),
    ("Final: \u200b5", 5, "not_integer"),  # zero-width space before the digits
    ("Final: 5\u200b", 5, "not_integer"),  # zero-width space is not stripped
    ("Final: 5\ufeff", 5, "not_integer"),  # BOM is not whitespace either
    ("Final: 5\x00", 5, "not_integer"),
    ("Final: \ud8005", 5, "not_integer"),  # lone surrogate
    ("Final: 5**", 5, "not_integer"),
    (f"Final: {FIVE_THOUSAND_DIGITS}", 5, "not_integer"),  # integer too long
    ("Final: " + "1" * (MAX_ANSWER_DIGITS + 1), 5, "not_integer"),  # one digit over the limit
    ("Final: " + "0" * 5000, 0, "not_integer"),  # length is checked before leading zeros
    # -- leading_zeros
    ("Final: 05", 5, "leading_zeros"),
    ("Final: -05", -5, "leading_zeros"),
    ("Final: 00", 0, "leading_zeros"),
    ("Final: -0", 0, "leading_zeros"),  # negative zero is rejected
    ("Final: -00", 0, "leading_zeros"),
    ("Final: 007", 7, "leading_zeros"),
    # -- missing_prefix
    ("final: 5", 5, "missing_prefix"),
    ("FINAL: 5", 5, "missing_prefix"),
    ("Final\uff1a 5", 5, "missing_prefix"),  # fullwidth colon
    ("Final ; 5", 5, "missing_prefix"),
    ("Final : 5", 5, "missing_prefix"),
    ("Answer: 5", 5, "missing_prefix"),
    ("5", 5, "missing_prefix"),
    ("", 5, "missing_prefix"),
    ("   \n\t  ", 5, "missing_prefix"),  # empty after strip
    ("**Final: 5**", 5, "missing_prefix"),  # markdown
    ("`Final: 5`", 5, "missing_prefix"),
    ("The answer is Final: 5", 5, "missing_prefix"),
    ("F\u0456nal: 5", 5, "missing_prefix"),  # Cyrillic small i
    ("Fin\u0430l: 5", 5, "missing_prefix"),  # Cyrillic small a
    ("\uff26inal: 5", 5, "missing_prefix"),  # fullwidth F
    ("\ufeffFinal: 5", 5, "missing_prefix"),  # BOM in front is not stripped
    ("\u200bFinal: 5", 5, "missing_prefix"),
    ("\ud800Final: 5", 5, "missing_prefix"),
    # -- not_single_line: any character str.splitlines() splits on, inside the text
    ("Final: 5\nFinal: 5", 5, "not_single_line"),  # two Final lines
    ("Final: 5\nFinal: 6", 5, "not_single_line"),
    ("Reasoning...\nFinal: 5", 5, "not_single_line"),
    ("Final: 5\rFinal: 5", 5, "not_single_line"),
    ("Final: 5\r\n", 5, "correct"),  # (trailing break is stripped: control case)
    ("Final: 5\r\nbye", 5, "not_single_line"),
    ("Final: 5\u20285", 5, "not_single_line"),  # LINE SEPARATOR
    ("Final: 5\u20295", 5, "not_single_line"),  # PARAGRAPH SEPARATOR
    ("Final: 5\x855", 5, "not_single_line"),  # NEL
    ("Final: 5\x0b5", 5, "not_single_line"),  # vertical tab
    ("Final: 5\x0c5", 5, "not_single_line"),  # form feed
    ("Final: 5\x1c5", 5, "not_single_line"),  # file separator
    ("final:\n5", 5, "not_single_line"),  # line break beats missing prefix
    ("Final:\n5", 5, "not_single_line"),
    # -- wrong_answer
    ("Final: 56", 57, "wrong_answer"),
    ("Final: -57", 57, "wrong_answer"),
    ("Final: 0", 1, "wrong_answer"),
    (f"Final: {MAX_INT}", MAX_INT - 1, "wrong_answer"),
]


@pytest.mark.parametrize("completion,expected,outcome", EXPLOITS)
def test_exploit_table(completion, expected, outcome):
    result = score({"expected_answer": expected}, completion)
    assert check_shape(result) == outcome
    assert result["details"]["expected"] == expected
    if outcome != "correct":
        assert result["reward"] == 0.0


def test_exploit_table_is_big_enough():
    assert len([row for row in EXPLOITS if row[2] != "correct"]) >= 35
    # every format outcome and wrong_answer is exercised
    assert {row[2] for row in EXPLOITS} >= set(FORMAT_OUTCOMES) | {"wrong_answer"}


@pytest.mark.parametrize(
    "completion,fragment",
    [
        ("Final:  5", "exactly one space"),
        ("Final:\u00a05", "U+00A0"),
        ("Final: 05", "leading zeros"),
        ("Final: -0", "negative zero"),
        ("Final: " + "9" * 700, "integer too long"),
        ("Final: five", "not an ASCII integer"),
        ("Final: 5\n6", "more than one line"),
        ("final: 5", "case-sensitive"),
        ("", "empty"),
        ("Final:", "nothing after"),
    ],
)
def test_reasons_explain(completion, fragment):
    assert fragment in score({"expected_answer": 5}, completion)["details"]["reason"]


def test_line_break_set_matches_splitlines():
    """The scorer's line-break set is exactly what str.splitlines() splits on."""
    line_break_re = scorer_mod._LINE_BREAK_RE
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        splits = len(("a" + ch + "b").splitlines()) > 1
        assert (line_break_re.search(ch) is not None) == splits, hex(cp)
        if splits:
            assert outcome_of(5, "Final: 5" + ch + "5") == "not_single_line", hex(cp)


def test_huge_input_is_handled():
    assert outcome_of(5, "Final: 5" + " x" * 500_000) == "not_integer"
    assert outcome_of(5, "x" * 1_000_000) == "missing_prefix"
    assert outcome_of(5, "Final: 5\n" * 100_000) == "not_single_line"
    result = score({"expected_answer": 5}, "Final: " + "1" * 100_000)
    assert check_shape(result) == "not_integer"
    assert "integer too long" in result["details"]["reason"]
    assert len(result["details"]["reason"]) < 200


def test_lowest_int_str_limit_is_safe():
    """640 digits is the lowest limit CPython allows; the scorer must still work there."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert outcome_of(MAX_INT, f"Final: {MAX_INT}") == "correct"
        assert outcome_of(MAX_INT - 1, f"Final: {MAX_INT}") == "wrong_answer"
        assert outcome_of(5, "Final: " + "3" * 5000) == "not_integer"
    finally:
        sys.set_int_max_str_digits(old)


# --------------------------------------------------------------------------- non-str completions


@pytest.mark.parametrize(
    "completion,typename",
    [
        (None, "NoneType"),
        (b"Final: 5", "bytes"),
        (bytearray(b"Final: 5"), "bytearray"),
        (5, "int"),
        (5.0, "float"),
        (True, "bool"),
        (["Final: 5"], "list"),
        ({"text": "Final: 5"}, "dict"),
        (object(), "object"),
    ],
)
def test_non_str_completion(completion, typename):
    result = score({"expected_answer": 5}, completion)
    assert check_shape(result) == "missing_prefix"
    assert result["reward"] == 0.0
    assert result["details"]["reason"] == f"completion is not a string (got {typename})"
    assert result["details"]["expected"] == 5


def test_str_subclass_uses_real_contents():
    class Sneaky(str):
        def strip(self, *args):
            raise RuntimeError("boom")

        def startswith(self, *args):
            return True

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    assert outcome_of(5, Sneaky(" Final: 5 ")) == "correct"
    assert outcome_of(5, Sneaky("Final: 6")) == "wrong_answer"
    assert outcome_of(5, Sneaky("nope")) == "missing_prefix"


def test_object_lying_about_its_class():
    class Liar:
        @property
        def __class__(self):
            return str

    assert outcome_of(5, Liar()) == "missing_prefix"


# --------------------------------------------------------------------------- invalid examples


class RaisingMapping(dict):
    def __getitem__(self, key):
        raise RuntimeError("no")

    def get(self, *args):
        raise RuntimeError("no")


class BadInt(int):
    def __eq__(self, other):
        raise RuntimeError("no")

    __hash__ = int.__hash__


@pytest.mark.parametrize(
    "example",
    [
        {},
        {"answer": 5},
        {"expected_answer": "5"},
        {"expected_answer": 5.0},
        {"expected_answer": True},
        {"expected_answer": False},
        {"expected_answer": None},
        {"expected_answer": [5]},
        {"expected_answer": BadInt(5)},
        {"expected_answer": 10**MAX_ANSWER_DIGITS},  # 641 digits: unanswerable
        {"expected_answer": -(10**MAX_ANSWER_DIGITS)},
        {"expected_answer": 10**5000},
        None,
        [("expected_answer", 5)],
        "expected_answer",
        5,
        b"",
        RaisingMapping(expected_answer=5),
    ],
)
@pytest.mark.parametrize("completion", ["Final: 5", None, b"Final: 5", "garbage"])
def test_invalid_example(example, completion):
    result = score(example, completion)
    assert check_shape(result) == "invalid_example"
    assert result["reward"] == 0.0
    assert result["details"]["expected"] is None


def test_other_mappings_are_accepted():
    assert check_shape(score(MappingProxyType({"expected_answer": 5}), "Final: 5")) == "correct"

    class Sub(dict):
        pass

    assert check_shape(score(Sub(expected_answer=5), "Final: 5")) == "correct"
    assert check_shape(score({"expected_answer": 5, "other": object()}, "Final: 5")) == "correct"


def test_extreme_expected_bounds():
    assert outcome_of(MAX_INT, f"Final: {MAX_INT}") == "correct"
    assert check_shape(score({"expected_answer": MAX_INT + 1}, "Final: 5")) == "invalid_example"


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize(
    "example,completion",
    [
        ({"expected_answer": 42}, "Final: 42"),
        ({"expected_answer": 42}, "Final: 41"),
        ({"expected_answer": 42}, "Final:  42"),
        ({"expected_answer": 42}, "Final: ４２"),
        ({"expected_answer": 42}, None),
        ({"expected_answer": "42"}, "Final: 42"),
    ],
)
def test_deterministic(example, completion):
    results = [score(example, completion) for _ in range(3)]
    assert results[0] == results[1] == results[2]
    # fresh dicts: mutating one result cannot affect the next call
    results[0]["details"]["outcome"] = "tampered"
    assert score(example, completion) == results[1]


# --------------------------------------------------------------------------- properties

ANYTHING = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.binary(),
    st.text(),
    st.lists(st.integers()),
)


@settings(max_examples=300, deadline=None)
@given(completion=st.text(), n=st.integers(min_value=-(10**30), max_value=10**30))
def test_property_any_text_never_raises(completion, n):
    check_shape(score({"expected_answer": n}, completion))


@settings(max_examples=300, deadline=None)
@given(completion=st.binary(), n=st.integers())
def test_property_any_bytes_never_raises(completion, n):
    assert outcome_of(n, completion) == "missing_prefix"


@settings(max_examples=300, deadline=None)
@given(completion=ANYTHING, answer=ANYTHING)
def test_property_any_object_never_raises(completion, answer):
    outcome = check_shape(score({"expected_answer": answer}, completion))
    if type(answer) is not int:
        assert outcome == "invalid_example"
    # the arbitrary object as the example itself
    assert check_shape(score(answer, completion)) == "invalid_example"
    assert check_shape(score(completion, answer)) == "invalid_example"


INT_RANGE = st.integers(min_value=-(10**MAX_ANSWER_DIGITS) + 2, max_value=10**MAX_ANSWER_DIGITS - 2)


@settings(max_examples=300, deadline=None)
@given(n=INT_RANGE | st.integers())
def test_property_roundtrip(n):
    if abs(n) + 1 >= 10**MAX_ANSWER_DIGITS:  # unbounded st.integers() could in theory get here
        return
    right = score({"expected_answer": n}, f"Final: {n}")
    assert check_shape(right) == "correct"
    assert right["reward"] == 1.0 and right["details"]["parsed"] == n
    wrong = score({"expected_answer": n}, f"Final: {n + 1}")
    assert check_shape(wrong) == "wrong_answer"
    assert wrong["reward"] == 0.0 and wrong["details"]["parsed"] == n + 1


def reference_outcome(text: str, expected: int) -> str:
    """Independent, deliberately naive restatement of the spec."""
    s = text.strip()
    if len(s.splitlines()) > 1:
        return "not_single_line"
    if not s.startswith("Final:"):
        return "missing_prefix"
    rest = s[len("Final:") :]
    if len(rest) < 2 or rest[0] != " " or rest[1].isspace():
        return "extra_whitespace"
    answer = rest[1:]
    body = answer[1:] if answer.startswith("-") else answer
    if not body or any(c not in "0123456789" for c in body) or len(body) > 640:
        return "not_integer"
    if body[0] == "0" and (len(body) > 1 or answer.startswith("-")):
        return "leading_zeros"
    return "correct" if int(answer) == expected else "wrong_answer"


TRICKY_CHARS = st.sampled_from(
    list("Final: -+0123456789fx.,e_")
    + ["\n", "\r", "\t", "\x0b", "\x85", "\u2028", "\u00a0", "\u3000", "\u200b"]
    + ["\uff15", "\u0665", "\u096b", "\uff1a", "\u0456", "\ud800"]
)
TRICKY_TEXT = st.builds(
    lambda head, body: head + body,
    st.sampled_from(["", "Final: ", "Final:", "Final:  ", " Final: ", "\nFinal: ", "final: ", "Final: -"]),
    st.text(alphabet=TRICKY_CHARS, max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(text=TRICKY_TEXT, expected=st.integers(min_value=-30, max_value=30))
def test_property_matches_reference(text, expected):
    assert outcome_of(expected, text) == reference_outcome(text, expected)
    assert outcome_of(expected, text) == outcome_of(expected, text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(), expected=st.integers(min_value=-(10**6), max_value=10**6))
def test_property_matches_reference_any_text(text, expected):
    assert outcome_of(expected, text) == reference_outcome(text, expected)
