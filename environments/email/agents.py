"""Scripted agents that play the email task through the real tools, and the loop that runs them.

- :func:`oracle` searches with the question's stored keywords, reads hits newest first and
  answers from the first message that fits the question, citing what it read. It sees only
  the question, the stored keywords and hop descriptions (what to look for), and the tool
  replies; never the answer or the source ids. It bounds what the task allows.
- :func:`demonstrator` is the warm-start teacher: a good searcher with human slips. It reads
  in search rank order rather than newest first, sometimes answers from the first message with
  the right kind of line without checking it is the right one (a distractor), sometimes starts
  with a sloppy query and has to search again, and gives up after a few reads.
- :func:`random_agent` calls random tools with random, often broken, arguments: a floor.

An agent is a generator: it yields one turn at a time, either a list of ``(tool name, raw
arguments)`` calls or a plain-text reply, and is sent back the contents of the replies.
:func:`play` runs one through an :class:`~environments.email.episode.Episode` and returns the
OpenAI-format conversation.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from environments.email.episode import Episode, EpisodeResult
from environments.email.facts import field_value, mentions
from environments.email.search import Index
from environments.email.tools import NO_RESULTS

Call = tuple[str, str]  # tool name, arguments as the raw JSON string
Turn = list[Call] | str  # a plain string is a reply without a tool call
AgentRun = Generator[Turn, list[str], None]
Agent = Callable[[Mapping[str, Any], random.Random], AgentRun]


@dataclass(frozen=True)
class Played:
    messages: list[dict[str, Any]]  # the OpenAI-format conversation, from its opening
    result: EpisodeResult


def call(name: str, **arguments: Any) -> Call:
    return name, json.dumps(arguments, separators=(",", ":"))


def play(
    scenario: Mapping[str, Any],
    agent: Agent,
    *,
    max_turns: int = 6,
    seed: int = 0,
    index: Index | None = None,
    opening: list[dict[str, Any]] | None = None,
) -> Played:
    """Run ``agent`` on ``scenario`` until the episode ends; deterministic in ``seed``.

    The conversation starts from ``opening`` (the environment's; by default the question alone).
    """
    episode = Episode(scenario, max_turns, index=index)
    if opening is None:
        opening = [{"role": "user", "content": str(scenario.get("question", ""))}]
    messages = list(opening)
    run = agent(scenario, random.Random(seed))
    replies: list[str] | None = None
    numbered = 0
    while not episode.done:
        try:
            turn = run.send(replies)  # type: ignore[arg-type]  # the first send is None, as generators require
        except StopIteration:
            turn = ""  # the agent has nothing more to say
        if isinstance(turn, str) or not turn:
            messages.append({"role": "assistant", "content": turn if isinstance(turn, str) else ""})
            out = episode.no_tool_call()
        else:
            tool_calls = [
                {"id": f"call_{numbered + i}", "type": "function", "function": {"name": name, "arguments": arguments}}
                for i, (name, arguments) in enumerate(turn)
            ]
            numbered += len(tool_calls)
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
            out = episode.tool_calls(tool_calls)
        messages.extend(out)
        replies = [m["content"] for m in out]
    return Played(messages=messages, result=episode.result())


# ----------------------------------------------------------------------------- reading replies


def hit_ids(reply: str) -> list[tuple[str, str]]:
    """(id, date) of each line of a search_inbox reply; none for an error or no results."""
    if reply.startswith("error:") or reply == NO_RESULTS:
        return []
    hits = []
    for line in reply.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2:
            hits.append((parts[0], parts[1]))
    return hits


def fits(reply: str, hop: Mapping[str, Any], match: list[str]) -> str | None:
    """The hop's field value if a read_email reply is the message the hop looks for."""
    if reply.startswith("error:"):
        return None
    _, _, text = reply.partition("\n")  # subject and body, without the header line
    value = field_value(text, hop["field"])
    return value if value is not None and mentions(text, match) else None


# ---------------------------------------------------------------------------------- the agents


def oracle(scenario: Mapping[str, Any], rng: random.Random) -> AgentRun:
    """Search, read newest first until a message fits, follow the link to the next hop, answer."""
    hops = scenario["hops"]
    query, match = scenario["keywords"][0], list(hops[0]["match"])
    value, cited, read = "", [], set()
    for number, hop in enumerate(hops):
        if number:  # a later hop looks up what the previous one found (an order number, say)
            query, match = value, [value]
        (reply,) = yield [call("search_inbox", keywords=query)]
        found = None
        for message_id, _ in sorted(hit_ids(reply), key=lambda h: (h[1], h[0]), reverse=True):
            if message_id in read:
                continue
            read.add(message_id)
            (text,) = yield [call("read_email", message_id=message_id)]
            if (found := fits(text, hop, match)) is not None:
                cited.append(message_id)
                break
        if found is None:
            break
        value = found
    yield [call("return_final_answer", answer=value if len(cited) == len(hops) else "", source_ids=cited)]


SLOPPY_WORDS = ("my", "email", "the", "info", "details", "when")


def demonstrator(
    scenario: Mapping[str, Any],
    rng: random.Random,
    *,
    careless: float = 0.15,
    sloppy_query: float = 0.2,
    max_reads: int = 4,
) -> AgentRun:
    """A good searcher with slips; see the module docstring. Deterministic in ``rng``."""
    hops = scenario["hops"]
    query, match = scenario["keywords"][0], list(hops[0]["match"])
    value, cited = "", []
    for number, hop in enumerate(hops):
        if number:
            query, match = value, [value]
        if rng.random() < sloppy_query:  # an extra word that the mail does not contain: no results, or too few
            yield [call("search_inbox", keywords=f"{query} {rng.choice(SLOPPY_WORDS)}")]
        (reply,) = yield [call("search_inbox", keywords=query)]
        hasty = rng.random() < careless
        found = None
        for message_id, _ in hit_ids(reply)[:max_reads]:  # rank order, not newest first
            (text,) = yield [call("read_email", message_id=message_id)]
            if text.startswith("error:"):
                continue
            candidate = field_value(text.partition("\n")[2], hop["field"])
            if candidate is not None and (hasty or fits(text, hop, match) is not None):
                found = candidate
                cited.append(message_id)
                break
        if found is None:
            break
        value = found
    yield [call("return_final_answer", answer=value if len(cited) == len(hops) else "", source_ids=cited)]


TOOL_NAMES = ("search_inbox", "read_email", "return_final_answer")


def _random_word(rng: random.Random, question: str) -> str:
    words = re.findall(r"\w+", question) or ["x"]
    if rng.random() < 0.7:
        return rng.choice(words)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(rng.randint(1, 8)))


def _random_arguments(rng: random.Random, name: str, scenario: Mapping[str, Any]) -> str:
    question = str(scenario.get("question", ""))
    prefix = str(scenario.get("inbox", "a"))[:1]
    draw = rng.random()
    if draw < 0.15:  # broken JSON
        return rng.choice(("{", "{'keywords': 1}", "[]", "null", '{"a":', "keywords=flight"))
    if draw < 0.3:  # the wrong shape
        return json.dumps({rng.choice(("query", "id", "text", "keywords")): rng.choice((1, None, [], "x"))})
    if name == "search_inbox":
        return json.dumps({"keywords": " ".join(_random_word(rng, question) for _ in range(rng.randint(1, 3)))})
    if name == "read_email":
        return json.dumps({"message_id": f"{prefix}{rng.randint(0, 399):03d}"})
    ids = [f"{prefix}{rng.randint(0, 399):03d}" for _ in range(rng.randint(0, 3))]
    return json.dumps({"answer": _random_word(rng, question), "source_ids": ids})


def random_agent(scenario: Mapping[str, Any], rng: random.Random) -> AgentRun:
    """Random tools, random arguments, random answers, and now and then plain text."""
    while True:
        draw = rng.random()
        if draw < 0.1:
            yield _random_word(rng, str(scenario.get("question", "")))
            continue
        if draw < 0.2:
            name = rng.choice(("search", "read", "answer", "final_answer"))
        else:
            name = rng.choice(TOOL_NAMES)
        yield [(name, _random_arguments(rng, name, scenario))]

