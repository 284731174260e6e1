"""The committed email corpus as the environment reads it: where its files are, and how its facts read.

Facts sit on ``Label: value`` lines, as in real confirmation mail, so an answer is a short span that can be
checked exactly. Which message answers a hop is one rule a good searcher also follows (:func:`truth`). The
generator (:mod:`environments.email.corpus`, run offline) writes the files and keeps only the questions this
rule answers; nothing here imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import Any

# Package data (pyproject.toml), read through importlib.resources so that any install finds it; a pathlib.Path when
# the package is a folder on disk, as in the checkout the generator writes to.
SCENARIO_DIR = files("environments.email") / "data"
MESSAGES_FILE = "messages.jsonl"
MESSAGE_ID_PATTERN = r"^[a-z][0-9]{3}$"  # how the corpus names a message: its inbox's letter and a number (a042)


def field_value(body: str, label: str) -> str | None:
    """The value of the first ``label: value`` line of ``body``, or None."""
    found = re.search(rf"^{re.escape(label)}: (.+)$", body, re.MULTILINE)
    return found.group(1).strip() if found else None


def mentions(text: str, match: Sequence[str]) -> bool:
    """Whether ``text`` holds every string of ``match``, ignoring case."""
    folded = text.casefold()
    return all(m.casefold() in folded for m in match)


def truth(messages: Sequence[Mapping[str, Any]], hop: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The newest message that mentions every ``match`` string and has the ``field`` line."""
    found = None
    for msg in messages:  # chronological
        text = f"{msg['subject']}\n{msg['body']}"
        if field_value(msg["body"], hop["field"]) is not None and mentions(text, hop["match"]):
            found = msg
    return found
