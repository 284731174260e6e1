"""The email verdict ("email_answer"): a deterministic, total, versioned check of a final answer.

An answer is correct when it equals the ground truth after normalisation AND cites every
ground-truth source message, citing at most MAX_CITATIONS distinct ids (so citing everything
read does not pass). Normalisation forgives form, never content:

- Unicode NFKC, casefold, whitespace collapsed, surrounding punctuation and quotes stripped;
- money and plain numbers compare by value: ``$1,200.00`` == ``1200`` == ``USD 1200`` (a
  currency sign or code is dropped, thousands separators must be well placed, no leading zeros);
- clock times compare by value: ``9:30`` == ``09:30``.

Dates are ISO (``2024-05-02``) as in the mail; other spellings are not recognised.

Outcomes, first match wins: invalid_scenario -> no_answer (None or empty) -> malformed (not a
string, over MAX_ANSWER_CHARS, source ids not a list of strings) -> wrong_answer ->
too_many_citations -> uncited -> correct. ``reward`` is 1.0 iff correct. ``verify`` never
raises; change SCORER_VERSION whenever a verdict could change.

:func:`shaped_reward` is the training reward; validation accuracy always comes from ``verify``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

SCORER_NAME = "email_answer"
SCORER_VERSION = "email-answer-1.0.0"

CORRECT = "correct"
WRONG_ANSWER = "wrong_answer"
UNCITED = "uncited"
TOO_MANY_CITATIONS = "too_many_citations"
NO_ANSWER = "no_answer"
MALFORMED = "malformed"
INVALID_SCENARIO = "invalid_scenario"
OUTCOMES = (CORRECT, WRONG_ANSWER, UNCITED, TOO_MANY_CITATIONS, NO_ANSWER, MALFORMED, INVALID_SCENARIO)

MAX_CITATIONS = 3
MAX_ANSWER_CHARS = 200
MAX_SOURCE_IDS = 20  # a longer list is malformed, not merely over-cited
MAX_ID_CHARS = 32

_PUNCT = " \t\n\r\x0b\x0c.,;:!?\"'`()[]{}<>*_~|/\\"
_MONEY = re.compile(
    r"(?:[$\u20ac\u00a3]|usd|eur|gbp)?\s*"  # an optional currency sign or code
    r"(?P<num>-?(?:0|[1-9][0-9]{0,2}(?:,[0-9]{3})+|[1-9][0-9]*)(?:\.[0-9]+)?)"  # 1,200.50 or 1200.50
    r"\s*(?:usd|eur|gbp)?"
)
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})")


def normalize(text: str) -> str:
    """The comparable form of an answer (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split()).strip(_PUNCT)
    if (money := _MONEY.fullmatch(text)) is not None:
        value = Decimal(money.group("num").replace(",", ""))  # the pattern admits only valid decimals
        return "0" if value == 0 else format(value.normalize(), "f")
    if (clock := _TIME.fullmatch(text)) is not None:
        return f"{int(clock.group(1))}:{clock.group(2)}"
    return text


def _result(outcome: str, reason: str) -> dict[str, Any]:
    return {
        "reward": 1.0 if outcome == CORRECT else 0.0,
        "details": {"outcome": outcome, "reason": reason, "scorer_version": SCORER_VERSION},
    }


def _snippet(text: str, limit: int = 30) -> str:
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _read_scenario(scenario: Any) -> tuple[str, tuple[str, ...]] | str:
    """(answer, source ids) of a well-formed scenario, or the reason it is not."""
    try:
        if not isinstance(scenario, Mapping):
            return "scenario is not a mapping"
        answer, sources = scenario.get("answer"), scenario.get("source_ids")
    except Exception:  # noqa: BLE001 - foreign mapping code
        return "reading the scenario raised"
    if type(answer) is not str or not normalize(answer):
        return "scenario answer must be a non-empty string"
    if type(sources) not in (list, tuple) or not sources or not all(type(s) is str and s for s in sources):
        return "scenario source_ids must be a non-empty list of strings"
    return answer, tuple(sources)


def verify(scenario: Any, answer: Any, source_ids: Any) -> dict[str, Any]:
    """The verdict on a final ``answer`` citing ``source_ids``; total and deterministic.

    Returns ``{"reward": 1.0 | 0.0, "details": {"outcome", "reason", "scorer_version", ...}}``.
    """
    try:
        return _verify(scenario, answer, source_ids)
    except Exception:  # noqa: BLE001 - the contract is "never raises"; reached only by hostile str subclasses
        return _result(MALFORMED, "answer could not be read")


def _verify(scenario: Any, answer: Any, source_ids: Any) -> dict[str, Any]:
    read = _read_scenario(scenario)
    if isinstance(read, str):
        return _result(INVALID_SCENARIO, read)
    expected, sources = read
    if answer is None:
        return _result(NO_ANSWER, "no final answer was given")
    if type(answer) is not str:
        return _result(MALFORMED, f"answer must be a string, got {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        return _result(MALFORMED, f"answer over {MAX_ANSWER_CHARS} chars")
    if type(source_ids) not in (list, tuple):
        return _result(MALFORMED, f"source_ids must be a list, got {type(source_ids).__name__}")
    if len(source_ids) > MAX_SOURCE_IDS or not all(type(s) is str and len(s) <= MAX_ID_CHARS for s in source_ids):
        return _result(MALFORMED, f"source_ids must be at most {MAX_SOURCE_IDS} short strings")
    given = normalize(answer)
    if not given:
        return _result(NO_ANSWER, "the answer is empty")
    if given != normalize(expected):
        return _result(WRONG_ANSWER, f"answer {_snippet(answer)} != expected {_snippet(expected)}")
    cited = {s.strip() for s in source_ids}
    if len(cited) > MAX_CITATIONS:
        return _result(TOO_MANY_CITATIONS, f"cited {len(cited)} messages; at most {MAX_CITATIONS} allowed")
    missing = [s for s in sources if s not in cited]
    if missing:
        return _result(UNCITED, f"right answer, but source {', '.join(missing)} not cited")
    return _result(CORRECT, f"answer {_snippet(answer)} == expected, sources cited")


# ------------------------------------------------------------------------------- shaped reward

CORRECT_WEIGHT = 1.0
CITED_READ_WEIGHT = 0.2
READ_WEIGHT = 0.1
INVALID_PENALTY = 0.05
MAX_INVALID_PENALIZED = 6
# Every episode that ends without the right answer costs this: out of turns, a wrong answer, or one the verifier
# refuses (uncited, too many citations, malformed), so no way of ending pays more than another. A wrong answer once
# cost nothing where running out of turns cost this, and in 4 RL steps every unanswered validation episode became a
# wrong answer (no_answer 18 -> 0); costing 0.5, below no answer (ART-E's order), the policy stopped answering at all
# (no_answer 19 -> 50). Priced alike, two seeds went opposite ways (README Results, issue 32).
MISSED_PENALTY = 0.2


def shaped_reward(
    *,
    correct: bool,
    sources: Any,
    cited: Any,
    read: Any,
    invalid_tool_calls: int,
) -> float:
    """The training reward of one episode, a pure function of what happened in it::

        reward = 1.0 * correct                                   (verify's verdict)
               + 0.2 * |sources cited and read| / |sources|      (read with read_email)
               + 0.1 * |sources read| / |sources|                (found, even if not cited)
               - 0.05 * min(invalid_tool_calls, 6)
               - 0.2 * (not correct)                             (out of turns, or answered and not correct)

    so it lies in [-0.5, 1.3]; a correct episode always outscores an incorrect one, and an incorrect one scores the
    same whether it answered or ran out of turns. Citing counts only for sources the policy actually opened, so guessed
    ids earn nothing.
    """
    try:
        truth = {s for s in sources if isinstance(s, str)}
        cited_set = {s for s in cited if isinstance(s, str)} if cited else set()
        read_set = {s for s in read if isinstance(s, str)} if read else set()
        invalid = max(0, int(invalid_tool_calls))
    except Exception:  # noqa: BLE001
        truth, cited_set, read_set, invalid = set(), set(), set(), 0
    share = (lambda found: len(found & truth) / len(truth)) if truth else (lambda found: 0.0)
    reward = (
        CORRECT_WEIGHT * bool(correct)
        + CITED_READ_WEIGHT * share(cited_set & read_set)
        + READ_WEIGHT * share(read_set)
        - INVALID_PENALTY * min(invalid, MAX_INVALID_PENALIZED)
        - MISSED_PENALTY * (not correct)
    )
    return round(reward, 6)
