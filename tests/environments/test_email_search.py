"""Full-text search over the email corpus: finds the sources, and policy text cannot break or inject it."""

from __future__ import annotations

import threading

import pytest

from environments.email import search
from environments.email.env import EmailEnvironment
from environments.email.search import SearchError, fts_query, read_email, search_inbox

INBOX = "ana@acme.co"


def test_each_val_question_finds_its_sources_in_the_top_five():
    for row in EmailEnvironment().scenarios("val"):
        for keywords, source in zip(row["keywords"], row["source_ids"]):
            hits = search_inbox(row["inbox"], keywords)
            assert 1 <= len(hits) <= 5
            assert source in [h["id"] for h in hits], (row["id"], keywords)
            assert set(hits[0]) == {"id", "date", "from", "subject", "snippet"}


def test_read_email_and_inbox_isolation():
    msg = read_email(INBOX, "a001")
    assert msg is not None and msg["id"] == "a001" and msg["inbox"] == INBOX and msg["body"]
    assert read_email(INBOX, "b001") is None  # another inbox's message
    assert read_email(INBOX, "a999") is None
    assert read_email(INBOX, "' OR 1=1 --") is None
    assert all(h["id"].startswith("a") for h in search_inbox(INBOX, "invoice", limit=50))


def test_filters():
    everything = search_inbox(INBOX, "flight", limit=50)
    from_skyair = search_inbox(INBOX, "flight", from_="SKYAIR", limit=50)
    assert from_skyair and all("skyair" in h["from"] for h in from_skyair) and len(from_skyair) < len(everything)
    assert search_inbox(INBOX, "flight", to="nobody@nowhere", limit=50) == []
    late = search_inbox(INBOX, "flight", sent_after="2024-07-01", limit=50)
    early = search_inbox(INBOX, "flight", sent_before="2024-07-01", limit=50)
    assert all(h["date"] >= "2024-07-01" for h in late) and all(h["date"] < "2024-07-01" for h in early)
    assert len(late) + len(early) == len(everything)
    for bad in ("2024-13-01", "2024-02-30", "July 4", "'; DROP TABLE messages; --"):
        with pytest.raises(SearchError):
            search_inbox(INBOX, "flight", sent_after=bad)


HOSTILE = [
    '"unbalanced', "NEAR(", "NEAR(flight invoice, 2)", "a OR", "OR", "AND", "NOT flight", "*", "flig*", "-flight",
    "subject:flight", "body:", "^flight", "{subject body}: x", "flight AND (", ")", "'; DROP TABLE messages; --",
    "\" OR \"\"=\"", "\x00", "flight\x00invoice", "🙂 flight", "é" * 300, "a" * 5000, "flight " * 500,
]  # fmt: skip


@pytest.mark.parametrize("keywords", HOSTILE)
def test_hostile_keywords_never_raise_or_inject(keywords):
    try:
        hits = search_inbox(INBOX, keywords)
    except SearchError as exc:
        assert str(exc) == "keywords must contain a word"
        return
    assert isinstance(hits, list) and len(hits) <= 5
    assert all(h["id"].startswith("a") for h in hits)
    assert search_inbox(INBOX, "flight")  # the table is still there


def test_queries_are_quoted_words_only():
    assert fts_query('NEAR(a OR "b*" c:d - e)') == '"NEAR" "a" "OR" "b" "c" "d" "e"'
    assert fts_query("INV-4821") == '"INV" "4821"'
    assert fts_query("a_b") == '"a" "b"'
    for empty in ("", "   ", "*", '"', "-:()"):
        with pytest.raises(SearchError):
            search_inbox(INBOX, empty)


def test_concurrent_reads_from_threads():
    search.default_index()
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(50):
                assert search_inbox(INBOX, "invoice") and read_email(INBOX, "a001")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
