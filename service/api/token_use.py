"""When each token was last used (``artsvc token list``), recorded without a write per request: an API process keeps
the uses it sees in memory, at most one per token a minute, and writes them together a minute after the first of
them, on a thread (taking its turn among the API's SQLite writers), never on the event loop and never in a request's
way. Each statement also skips a row another process wrote within the minute. The cost: "last used" is to the minute,
and the uses of a process's last minute before it stops are not written. A failed write is logged and forgotten."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

from fastapi import Request
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from service.store import db as store_db
from service.store.tables import utcnow
from service.store.tokens import LAST_USED_RESOLUTION, note_uses

log = logging.getLogger(__name__)
MAX_REMEMBERED = 10_000  # tokens whose last note this process remembers; past it, it forgets them all


class TokenUse:
    """One API process's uses of tokens, written to the store in batches."""

    def __init__(self, engine: Engine, *, flush_after_s: float = LAST_USED_RESOLUTION.total_seconds()) -> None:
        self._engine = engine
        self._flush_after_s = flush_after_s
        self._noted: dict[str, float] = {}  # token id -> time.monotonic() of its last note
        self._pending: dict[str, datetime] = {}  # token id -> when it was used, not yet written

    def note(self, token_id: str) -> None:
        """The token authenticated a request now (called on the event loop)."""
        now = time.monotonic()
        if now - self._noted.get(token_id, -float("inf")) < LAST_USED_RESOLUTION.total_seconds():
            return
        if len(self._noted) >= MAX_REMEMBERED:
            self._noted.clear()
        self._noted[token_id] = now
        if not self._pending:
            asyncio.get_running_loop().call_later(self._flush_after_s, self._flush)
        self._pending[token_id] = utcnow()

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        asyncio.get_running_loop().run_in_executor(None, self._write, pending)

    def _write(self, uses: dict[str, datetime]) -> None:
        try:
            with store_db.one_writer(self._engine), self._engine.begin() as connection:
                note_uses(connection, uses=uses)
        except SQLAlchemyError as exc:
            log.warning("could not record when %d tokens were last used: %s", len(uses), exc)


def note_token_use(request: Request, token_id: str) -> None:
    """Note the use on the app's :class:`TokenUse` (``app.state.token_use``), made on the first use if the app has
    none."""
    state = request.app.state
    if (token_use := getattr(state, "token_use", None)) is None:
        token_use = state.token_use = TokenUse(state.engine)
    token_use.note(token_id)
