"""The three tools of the email agent, bound to one inbox, and the terse texts they answer with.

Replies are as short as they can be while still carrying what a searcher needs: one line per
hit (``a042 2024-03-02 trips@skyair.com Flight to Oslo``), a message as a header line, its
subject and its body. The default policy pays a token for every character it reads.

The arguments' schemas say what a good call looks like, as tight as the corpus allows (ids by their pattern, short
strings, a few sources): a policy held to them by the sampler (``tool_choice``) cannot write a query where an id
goes, nor a string that runs on past its reply's token limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from environments.email.facts import MESSAGE_ID_PATTERN
from environments.email.search import MAX_HITS, Index, SearchError, default_index
from environments.tools import Tool, ToolArguments, ToolBox, ToolError

NO_RESULTS = "no results"
ANSWERED = "ok"
# The corpus's longest are 27 (keywords) and 12 (answers) characters; a question has at most 2 source emails.
MAX_KEYWORDS_CHARS = 60
MAX_ADDRESS_CHARS = 40
MAX_TOOL_ANSWER_CHARS = 60
MAX_CITED = 4


def _real_day(value: str) -> str:
    date.fromisoformat(value)  # the pattern has the shape; this rejects 2024-02-30
    return value


Day = Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), AfterValidator(_real_day)]


class SearchArgs(ToolArguments):
    keywords: str = Field(min_length=1, max_length=MAX_KEYWORDS_CHARS, description="words that must all appear")
    from_: str | None = Field(
        None, alias="from", max_length=MAX_ADDRESS_CHARS, description="part of the sender address"
    )
    to: str | None = Field(None, max_length=MAX_ADDRESS_CHARS, description="part of the recipient address")
    sent_after: Day | None = Field(None, description="sent on or after, YYYY-MM-DD")
    sent_before: Day | None = Field(None, description="sent before, YYYY-MM-DD")


MessageId = Annotated[str, Field(pattern=MESSAGE_ID_PATTERN)]


class ReadArgs(ToolArguments):
    message_id: MessageId = Field(description="an id from the search results")


class AnswerArgs(ToolArguments):
    answer: str = Field(max_length=MAX_TOOL_ANSWER_CHARS, description="the short answer")
    source_ids: list[MessageId] = Field(max_length=MAX_CITED, description="ids of the emails the answer is from")


@dataclass
class Session:
    """What one episode's tool calls did: the inbox they run in, and what they found."""

    inbox: str
    read: list[str] = field(default_factory=list)  # ids opened with read_email, in order, once each
    searches: int = 0
    final: tuple[str, list[str]] | None = None  # (answer, source ids) once return_final_answer ran


def hit_line(hit: dict[str, Any]) -> str:
    return f"{hit['id']} {hit['date']} {hit['from']} {hit['subject']}"


def message_text(msg: dict[str, Any]) -> str:
    return f"{msg['id']} {msg['date'][:10]} {msg['from']}\n{msg['subject']}\n{msg['body']}"


def toolbox(session: Session, index: Index | None = None) -> ToolBox:
    """search_inbox, read_email and return_final_answer over ``session.inbox``, recording into ``session``.

    ``index`` defaults to the committed corpus, loaded on the first search or read.
    """

    def corpus() -> Index:
        return index if index is not None else default_index()

    def search_inbox(
        keywords: str, from_: str | None, to: str | None, sent_after: str | None, sent_before: str | None
    ) -> str:
        try:
            hits = corpus().search(session.inbox, keywords, from_, to, sent_after, sent_before, limit=MAX_HITS)
        except SearchError as exc:
            raise ToolError(str(exc)) from None
        session.searches += 1
        return "\n".join(hit_line(h) for h in hits) or NO_RESULTS

    def read_email(message_id: str) -> str:
        msg = corpus().read(session.inbox, message_id.strip())
        if msg is None:
            raise ToolError(f"no message {message_id[:12]}")
        if msg["id"] not in session.read:
            session.read.append(msg["id"])
        return message_text(msg)

    def return_final_answer(answer: str, source_ids: list[str]) -> str:
        session.final = (answer, list(source_ids))
        return ANSWERED

    return ToolBox(
        [
            Tool("search_inbox", "Search the inbox; all keywords must match. Up to 5 lines: id date from subject.",
                 SearchArgs, search_inbox),  # fmt: skip
            Tool("read_email", "Read one email by its id.", ReadArgs, read_email),
            Tool("return_final_answer", "Give the short final answer and the ids of the emails it is from.",
                 AnswerArgs, return_final_answer),  # fmt: skip
        ]
    )


def tool_specs() -> list[dict[str, Any]]:
    """The OpenAI function-tool dicts of the three tools (the same for every inbox)."""
    return toolbox(Session(inbox="")).specs()
