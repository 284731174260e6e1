"""Strict math verifier ("math_strict"): a deterministic, total, explainable scorer.

Format spec (applied to ``completion.strip()``, i.e. Python's ``str.strip()``
with no arguments, so all leading/trailing Unicode whitespace is removed):

    the text must be exactly one line ``Final: <int>`` where
      * ``Final:`` is literal ASCII, case-sensitive (no fullwidth colon, no lookalikes);
      * exactly one ASCII space (U+0020) follows the colon, then a non-space character;
      * ``<int>`` is ``0`` or ``-?[1-9][0-9]*`` in ASCII digits only (no ``+``, no
        leading zeros, no ``-0``, no decimals/exponents/separators, no trailing text),
        with at most ``MAX_ANSWER_DIGITS`` (640) digits.

Outcomes are checked in this precedence order (first failure wins):
    invalid_example -> (non-str completion: missing_prefix) ->
    not_single_line -> missing_prefix -> extra_whitespace -> not_integer ->
    leading_zeros -> wrong_answer -> correct.

``reward`` is 1.0 iff the outcome is ``correct``, else 0.0.  ``score`` never
raises for any input; every result carries ``SCORER_VERSION`` and a plain-words
``reason``.  Change ``SCORER_VERSION`` whenever any verdict could change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "SCORER_NAME",
    "SCORER_VERSION",
    "OUTCOMES",
    "FORMAT_OUTCOMES",
    "MAX_ANSWER_DIGITS",
    "score",
]

SCORER_NAME = "math_strict"
SCORER_VERSION = "math-strict-1.0.0"

CORRECT = "correct"
WRONG_ANSWER = "wrong_answer"
MISSING_PREFIX = "missing_prefix"
EXTRA_WHITESPACE = "extra_whitespace"
NOT_SINGLE_LINE = "not_single_line"
LEADING_ZEROS = "leading_zeros"
NOT_INTEGER = "not_integer"
INVALID_EXAMPLE = "invalid_example"

OUTCOMES = (
    CORRECT,
    WRONG_ANSWER,
    MISSING_PREFIX,
    EXTRA_WHITESPACE,
    NOT_SINGLE_LINE,
    LEADING_ZEROS,
    NOT_INTEGER,
    INVALID_EXAMPLE,
)
FORMAT_OUTCOMES = (
    MISSING_PREFIX,
    EXTRA_WHITESPACE,
    NOT_SINGLE_LINE,
    LEADING_ZEROS,
    NOT_INTEGER,
)

# 640 is the smallest value CPython accepts for sys.set_int_max_str_digits()
# (0 means "unlimited"), so int(str) / str(int) on numbers with <= 640 digits
# can never raise ValueError, whatever the interpreter is configured with.
MAX_ANSWER_DIGITS = 640
_EXPECTED_BOUND = 10**MAX_ANSWER_DIGITS  # |expected| must be < this

_PREFIX = "Final:"
_PREFIX_LEN = len(_PREFIX)
_ANSWER_START = _PREFIX_LEN + 1  # index just after "Final: "
_KEY = "expected_answer"
_MISSING = object()

# Fast path: a whole, already-stripped, fully valid completion.  Explicit
# [0-9] classes (never \d, which matches Unicode digits).  Anything this
# accepts passes every slow-path check, so both paths agree by construction.
_FAST_RE = re.compile(r"Final: (?:0|-?[1-9][0-9]{0,%d})" % (MAX_ANSWER_DIGITS - 1))
# Answer token shape (checked after the prefix and the single space).
_INT_RE = re.compile(r"-?[0-9]+")
# Exactly the characters str.splitlines() splits on.
_LINE_BREAK_RE = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

# The real type.__name__ getter: immune to metaclasses that override __name__.
_TYPE_NAME = type.__dict__["__name__"].__get__


def _typename(obj: object) -> str:
    return _TYPE_NAME(type(obj))


def _snippet(text: str, limit: int = 40) -> str:
    """repr() of a bounded prefix of text (escapes surrogates/controls; never raises)."""
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


def _char_name(ch: str) -> str:
    return "U+%04X" % ord(ch)


def _result(outcome: str, parsed, expected, reason: str) -> dict:
    return {
        "reward": 1.0 if outcome == CORRECT else 0.0,
        "details": {
            "outcome": outcome,
            "scorer_version": SCORER_VERSION,
            "parsed": parsed,
            "expected": expected,
            "reason": reason,
        },
    }


def _read_expected(example):
    """Return (expected_int, None) or (None, reason) for an invalid example."""
    # Mapping access runs foreign code (__getitem__, __eq__ of colliding keys,
    # __instancecheck__), so it is the one place where exceptions are caught;
    # they are turned into an invalid_example verdict, never swallowed silently.
    try:
        if type(example) is dict:
            value = example.get(_KEY, _MISSING)
        elif isinstance(example, Mapping):
            try:
                value = example[_KEY]
            except KeyError:
                value = _MISSING
        else:
            return None, "example is not a mapping (got %s)" % _typename(example)
    except Exception as exc:  # foreign code raised while reading the example
        return None, "reading expected_answer from example raised %s" % _typename(exc)

    if value is _MISSING:
        return None, "example has no 'expected_answer' key"
    vtype = type(value)
    if vtype is not int:  # excludes bool and every int subclass (strict)
        if vtype is bool:
            return None, "expected_answer must be an int, not bool"
        return None, "expected_answer must be an int (got %s)" % _typename(value)
    if not -_EXPECTED_BOUND < value < _EXPECTED_BOUND:
        return None, "expected_answer has more than %d digits" % MAX_ANSWER_DIGITS
    return value, None


def _diagnose(text: str, expected: int) -> dict:
    """Slow path: classify an already-stripped exact str in precedence order."""
    # (1) line breaks
    m = _LINE_BREAK_RE.search(text)
    if m is not None:
        return _result(
            NOT_SINGLE_LINE,
            None,
            expected,
            "completion spans more than one line (line break %s at index %d)"
            % (_char_name(m.group()), m.start()),
        )

    # (2) prefix
    if not text.startswith(_PREFIX):
        if not text:
            reason = "completion is empty"
        elif text[:_PREFIX_LEN].lower() == "final:":
            reason = "prefix must be exactly 'Final:' (case-sensitive), got %s" % _snippet(
                text[:_PREFIX_LEN]
            )
        elif _PREFIX in text:
            reason = "completion must start with 'Final:' (found it later in the text)"
        else:
            reason = "completion does not start with 'Final:' (starts with %s)" % _snippet(
                text, 12
            )
        return _result(MISSING_PREFIX, None, expected, reason)

    # (3) exactly one U+0020 after the colon, then a non-space character
    rest = text[_PREFIX_LEN:]
    if not rest:
        return _result(
            EXTRA_WHITESPACE,
            None,
            expected,
            "nothing after 'Final:' (expected exactly one space, then an integer)",
        )
    first = rest[0]
    if first != " ":
        if first.isspace():
            reason = (
                "expected exactly one ASCII space (U+0020) after 'Final:', found %s"
                % _char_name(first)
            )
        else:
            reason = "expected exactly one space after 'Final:', found none"
        return _result(EXTRA_WHITESPACE, None, expected, reason)
    if len(rest) < 2:  # unreachable after strip(); kept so the path is total
        return _result(
            EXTRA_WHITESPACE, None, expected, "nothing after 'Final: ' (expected an integer)"
        )
    if rest[1].isspace():
        return _result(
            EXTRA_WHITESPACE,
            None,
            expected,
            "expected exactly one space after 'Final:', found extra whitespace %s"
            % _char_name(rest[1]),
        )

    # (4) ASCII integer shape and length
    answer = rest[1:]
    if _INT_RE.fullmatch(answer) is None:
        return _result(
            NOT_INTEGER,
            None,
            expected,
            "answer %s is not an ASCII integer (-?[0-9]+)" % _snippet(answer),
        )
    negative = answer[0] == "-"
    digits = answer[1:] if negative else answer
    if len(digits) > MAX_ANSWER_DIGITS:
        return _result(
            NOT_INTEGER,
            None,
            expected,
            "integer too long (%d digits > %d)" % (len(digits), MAX_ANSWER_DIGITS),
        )

    # (5) leading zeros / negative zero
    if digits[0] == "0" and (len(digits) > 1 or negative):
        if digits == "0":
            reason = "negative zero '-0' is not allowed; write 0"
        else:
            reason = "answer %s has leading zeros" % _snippet(answer)
        return _result(LEADING_ZEROS, None, expected, reason)

    # (6) value.  Unreachable in practice (the fast path accepts every string
    # that gets here), but kept so _diagnose is a complete classifier on its own.
    parsed = int(answer)  # <= 640 ASCII digits: cannot raise
    if parsed != expected:
        return _result(
            WRONG_ANSWER, parsed, expected, "answer %d != expected %d" % (parsed, expected)
        )
    return _result(CORRECT, parsed, expected, "answer %d == expected %d" % (parsed, expected))


def score(example, completion) -> dict:
    """Score one completion against ``example["expected_answer"]``.

    Promises: deterministic, pure, and total -- it never raises for any
    ``example`` / ``completion`` (None, bytes, ints, dicts, huge or odd Unicode
    strings, surrogates, hostile Mapping objects).  Failures are reported, not
    raised, as::

        {"reward": 1.0 | 0.0,
         "details": {"outcome": one of OUTCOMES, "scorer_version": SCORER_VERSION,
                     "parsed": int | None, "expected": int | None, "reason": str}}

    ``reward`` is 1.0 iff outcome == "correct".  The example is validated first
    (it must be a Mapping whose ``expected_answer`` is a plain ``int`` -- not
    bool, str or float -- with at most 640 digits, else ``invalid_example``).  A
    non-str completion yields ``missing_prefix``.  ``parsed`` is set only for
    ``correct`` / ``wrong_answer``; ``expected`` is set whenever the example is valid.
    """
    expected, bad_example = _read_expected(example)
    if bad_example is not None:
        return _result(INVALID_EXAMPLE, None, None, bad_example)

    ctype = type(completion)
    if ctype is not str:
        if not issubclass(ctype, str):
            return _result(
                MISSING_PREFIX,
                None,
                expected,
                "completion is not a string (got %s)" % _typename(completion),
            )
    # Unbound str.strip uses the C implementation even for str subclasses and
    # always returns an exact str, so nothing below runs user-overridden code.
    text = str.strip(completion)

    # Fast path: fully valid format.
    if _FAST_RE.fullmatch(text) is not None:
        parsed = int(text[_ANSWER_START:])  # <= 640 ASCII digits after "Final: ": cannot raise
        if parsed == expected:
            return {
                "reward": 1.0,
                "details": {
                    "outcome": CORRECT,
                    "scorer_version": SCORER_VERSION,
                    "parsed": parsed,
                    "expected": expected,
                    "reason": "answer %d == expected %d" % (parsed, expected),
                },
            }
        return {
            "reward": 0.0,
            "details": {
                "outcome": WRONG_ANSWER,
                "scorer_version": SCORER_VERSION,
                "parsed": parsed,
                "expected": expected,
                "reason": "answer %d != expected %d" % (parsed, expected),
            },
        }

    return _diagnose(text, expected)
