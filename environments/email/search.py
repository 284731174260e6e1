"""Full-text search over the email corpus: an in-memory SQLite FTS5 index.

The keywords come from the policy, so they are never handed to FTS5 as a query: they are cut
into words (runs of letters and digits) and each word is quoted, which leaves no operator,
column filter, prefix star or quote for the text to smuggle in; every value reaches SQLite as a
bound parameter. All words must match (as in ART-E), best BM25 first, newer first on ties.

The index is built once per process from the committed corpus. One connection serves every
thread, behind a lock: a query takes well under a millisecond.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from datetime import date
from functools import cache
from typing import Any

from environments.email.facts import MESSAGES_FILE, SCENARIO_DIR

MAX_HITS = 5
MAX_WORDS = 12
MAX_KEYWORD_CHARS = 200
SNIPPET_WORDS = 8
_WORD = re.compile(r"[^\W_]+")


class SearchError(ValueError):
    """A search that cannot run (no keywords, a bad date); the message is short and shown to the policy."""


def query_words(keywords: str) -> list[str]:
    """The words of ``keywords`` as FTS5 will see them (at most MAX_WORDS)."""
    return _WORD.findall(keywords[:MAX_KEYWORD_CHARS])[:MAX_WORDS]


def fts_query(keywords: str) -> str:
    """A safe FTS5 MATCH expression: every word quoted, all required."""
    return " ".join(f'"{word}"' for word in query_words(keywords))


def _check_day(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value):
        raise SearchError(f"{name} must be YYYY-MM-DD")
    try:
        date.fromisoformat(value)
    except ValueError:
        raise SearchError(f"{name} is not a real date") from None
    return value


class Index:
    """Messages and their FTS5 index in one in-memory database."""

    def __init__(self, messages: Iterable[Mapping[str, Any]]) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.executescript(
            """
            CREATE TABLE messages (
                n INTEGER PRIMARY KEY, id TEXT NOT NULL, inbox TEXT NOT NULL, date TEXT NOT NULL,
                sender TEXT NOT NULL, recipient TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL,
                reply_to TEXT, UNIQUE (inbox, id)
            );
            CREATE VIRTUAL TABLE fts USING fts5(
                sender, subject, body, content='messages', content_rowid='n', tokenize='unicode61'
            );
            """
        )
        rows = [
            (m["id"], m["inbox"], m["date"], m["from"], m["to"], m["subject"], m["body"], m.get("reply_to"))
            for m in messages
        ]
        self._db.executemany(
            "INSERT INTO messages (id, inbox, date, sender, recipient, subject, body, reply_to)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._db.execute("INSERT INTO fts (rowid, sender, subject, body) SELECT n, sender, subject, body FROM messages")
        self._db.commit()

    def search(
        self,
        inbox: str,
        keywords: str,
        from_: str | None = None,
        to: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        limit: int = MAX_HITS,
    ) -> list[dict[str, str]]:
        """Hits (id, date, from, subject, snippet) in ``inbox`` holding every keyword.

        ``from_`` and ``to`` match any part of an address, case-insensitively; ``sent_after``
        keeps messages sent on or after that day, ``sent_before`` those sent before it.
        Raises SearchError for empty keywords or malformed dates.
        """
        if not isinstance(keywords, str) or not query_words(keywords):
            raise SearchError("keywords must contain a word")
        after, before = _check_day(sent_after, "sent_after"), _check_day(sent_before, "sent_before")
        sql = [
            "SELECT m.id, m.date, m.sender, m.subject, snippet(fts, 2, '', '', '...', ?) FROM fts",
            "JOIN messages m ON m.n = fts.rowid WHERE fts MATCH ? AND m.inbox = ?",
        ]
        params: list[Any] = [SNIPPET_WORDS, fts_query(keywords), inbox]
        for column, value in (("sender", from_), ("recipient", to)):
            if value:
                sql.append(f"AND instr(lower(m.{column}), lower(?)) > 0")
                params.append(str(value)[:MAX_KEYWORD_CHARS])
        if after:
            sql.append("AND m.date >= ?")
            params.append(after)
        if before:
            sql.append("AND m.date < ?")
            params.append(before)
        sql.append("ORDER BY bm25(fts), m.date DESC, m.id LIMIT ?")
        params.append(max(1, min(int(limit), 50)))
        try:
            with self._lock:
                rows = self._db.execute(" ".join(sql), params).fetchall()
        except sqlite3.Error:  # unreachable with quoted words; a search must not crash a rollout
            raise SearchError("search failed") from None
        return [
            {"id": i, "date": d[:10], "from": s, "subject": subj, "snippet": snip} for i, d, s, subj, snip in rows
        ]

    def read(self, inbox: str, message_id: str) -> dict[str, Any] | None:
        """The message ``message_id`` of ``inbox``, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, inbox, date, sender, recipient, subject, body, reply_to FROM messages"
                " WHERE inbox = ? AND id = ?",
                (str(inbox), str(message_id)),
            ).fetchone()
        if row is None:
            return None
        keys = ("id", "inbox", "date", "from", "to", "subject", "body", "reply_to")
        return dict(zip(keys, row))


_build_lock = threading.Lock()


@cache
def _default_index() -> Index:
    path = SCENARIO_DIR / MESSAGES_FILE
    return Index(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def default_index() -> Index:
    """The index of the committed corpus, built on first use."""
    with _build_lock:
        return _default_index()


def search_inbox(
    inbox: str,
    keywords: str,
    from_: str | None = None,
    to: str | None = None,
    sent_after: str | None = None,
    sent_before: str | None = None,
    limit: int = MAX_HITS,
) -> list[dict[str, str]]:
    """Search the committed corpus; see :meth:`Index.search`."""
    return default_index().search(inbox, keywords, from_, to, sent_after, sent_before, limit)


def read_email(inbox: str, message_id: str) -> dict[str, Any] | None:
    """A message of the committed corpus, or None."""
    return default_index().read(inbox, message_id)
