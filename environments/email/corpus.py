"""Deterministic generation of the email corpus, its questions and their committed splits (offline).

Four inboxes of everyday mail in the manner of OpenPipe's ART-E (which used the Enron corpus):
flight and hotel bookings, meeting invites, invoices, orders and deliveries, dinner plans,
among newsletters, promotions and chit-chat threads (the makers are in :mod:`environments.email.events`).

Every fact event may come with a distractor that a careless searcher answers from: an earlier
booking to the same city on another date, a meeting moved to a new slot, a corrected invoice,
a delayed delivery, a changed restaurant. A question names what tells them apart (a date, the
word "corrected"), and its truth is defined by one rule a good searcher also follows: the
newest message of the inbox that mentions every ``match`` string and has the ``field`` line
(:func:`environments.email.facts.truth`). A question keeps the broadest keywords with which a
careful searcher (search, read the hits newest first) reaches the truth within six turns;
questions with no such keywords, or whose generator-intended source is not what the rule finds,
are dropped at generation.

Splits are disjoint by source message (whole events go to one split). Run
``python -m environments.email.corpus`` to regenerate the package data folder ``environments/email/data/``;
the environment reads only that output (:mod:`environments.email.facts`), never this module.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from environments.email.events import MAKERS, Inbox, Maker
from environments.email.facts import MESSAGES_FILE, SCENARIO_DIR, field_value, truth
from environments.email.search import Index

GENERATOR_SEED = 20240611
SPLIT_SIZES = {"train": 1200, "val": 100, "test": 100}
SEARCH_DEPTH = 5  # a question's source must be among this many hits of its keywords
MAX_TURNS_BUDGET = 6  # a careful searcher answers every question within this many turns

# owner, address, message id prefix
INBOXES = (
    ("Ana Silva", "ana@acme.co", "a"),
    ("Ben Okafor", "ben@acme.co", "b"),
    ("Cam Nguyen", "cam@acme.co", "c"),
    ("Dee Rossi", "dee@acme.co", "d"),
)
EVENTS_PER_INBOX = {"flight": 26, "hotel": 20, "meeting": 40, "invoice": 34, "order": 30, "dinner": 24}
FILLERS_PER_INBOX = 60


def _generate_inbox(rng: random.Random, owner: str, address: str, prefix: str) -> tuple[list[dict], list[dict]]:
    """Messages (with ids) and candidate questions (with source ids and event group) of one inbox."""
    inbox = Inbox(owner, address)
    maker = Maker(rng, inbox)
    plan = [kind for kind, n in EVENTS_PER_INBOX.items() for _ in range(n)] + ["filler"] * FILLERS_PER_INBOX
    rng.shuffle(plan)
    groups: list[str] = []  # per question: the event it is about
    for event, kind in enumerate(plan):
        MAKERS[kind](maker)
        groups.extend([f"{prefix}{event}"] * (len(inbox.questions) - len(groups)))
    order = sorted(inbox.drafts, key=lambda d: (d.sent, d.key))
    ids = {d.key: f"{prefix}{n:03d}" for n, d in enumerate(order)}
    messages = [
        {
            "id": ids[d.key],
            "inbox": address,
            "date": d.sent.strftime("%Y-%m-%d %H:%M"),
            "from": d.sender,
            "to": d.recipient,
            "subject": d.subject,
            "body": d.body,
            "reply_to": ids.get(d.reply_to),
        }
        for d in order
    ]
    questions = [
        {
            "group": group,
            "inbox": address,
            "kind": q.kind,
            "question": q.text,
            "answer": q.answer,
            "keywords": [list(h.keywords) for h in q.hops],
            "hops": [{"match": list(h.match), "field": h.field} for h in q.hops],
            "source_ids": [ids[h.source] for h in q.hops],
        }
        for q, group in zip(inbox.questions, groups)
    ]
    return messages, questions


def _search_plan(
    question: dict[str, Any], inbox_messages: Sequence[Mapping[str, Any]], index: Index
) -> list[str] | None:
    """The keywords of each hop with which a careful searcher answers in time, or None.

    Per hop the searcher runs the keywords, then reads hits newest first (skipping what it has
    read) until one has the hop's ``match`` strings and ``field``; that must be the generator's
    source, be the newest such message of the inbox (the truth rule), and leave the search,
    the reads and the final answer within MAX_TURNS_BUDGET turns.
    """
    plan: list[str] = []
    turns, read, value = 1, set(), None  # the final answer's turn
    for options, hop, source in zip(question["keywords"], question["hops"], question["source_ids"]):
        found = truth(inbox_messages, hop)
        if found is None or found["id"] != source:
            return None
        for keywords in options:
            hits = index.search(question["inbox"], keywords, limit=SEARCH_DEPTH)
            newest_first = sorted((h["id"] for h in hits if h["id"] not in read), reverse=True)  # ids follow time
            if source in newest_first:
                reads = newest_first[: newest_first.index(source) + 1]
                if turns + 1 + len(reads) <= MAX_TURNS_BUDGET:
                    break
        else:
            return None
        plan.append(keywords)
        turns += 1 + len(reads)
        read.update(reads)
        value = field_value(found["body"], hop["field"])
    return plan if value == question["answer"] else None


def generate(seed: int = GENERATOR_SEED) -> tuple[list[dict], dict[str, list[dict]]]:
    """The corpus and every split, deterministically from ``seed``."""
    rng = random.Random(seed)
    messages: list[dict] = []
    candidates: list[dict] = []
    for owner, address, prefix in INBOXES:
        inbox_messages, questions = _generate_inbox(rng, owner, address, prefix)
        messages.extend(inbox_messages)
        candidates.extend(questions)
    index = Index(messages)
    by_inbox: dict[str, list[dict]] = {}
    for msg in messages:
        by_inbox.setdefault(msg["inbox"], []).append(msg)
    kept = []
    for q in candidates:
        if (plan := _search_plan(q, by_inbox[q["inbox"]], index)) is not None:
            kept.append({**q, "keywords": plan})

    groups: dict[str, list[dict]] = {}
    for q in kept:
        groups.setdefault(q["group"], []).append(q)
    order = sorted(groups)
    rng.shuffle(order)
    splits: dict[str, list[dict]] = {}
    cursor = 0
    for split in ("val", "test", "train"):
        rows: list[dict] = []
        while len(rows) < SPLIT_SIZES[split]:
            if cursor == len(order):
                raise AssertionError(f"not enough questions for {split}: {len(rows)} < {SPLIT_SIZES[split]}")
            rows.extend(groups[order[cursor]][: SPLIT_SIZES[split] - len(rows)])  # the rest of a cut group is dropped
            cursor += 1
        rng.shuffle(rows)
        splits[split] = [
            {"id": f"email-{split}-{n:04d}", **{k: v for k, v in q.items() if k != "group"}} for n, q in enumerate(rows)
        ]
    return messages, splits


def canonical_bytes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """The JSONL bytes a file is stored and fingerprinted as."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=True) + "\n" for r in rows).encode()


def write(directory: Path = SCENARIO_DIR) -> dict[str, int]:
    """Write the corpus and the splits; returns row counts."""
    messages, splits = generate()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MESSAGES_FILE).write_bytes(canonical_bytes(messages))
    for split, rows in splits.items():
        (directory / f"{split}.jsonl").write_bytes(canonical_bytes(rows))
    return {"messages": len(messages), **{split: len(rows) for split, rows in splits.items()}}


if __name__ == "__main__":
    for name, count in write().items():
        print(f"{name}: {count}")
