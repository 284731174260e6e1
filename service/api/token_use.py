"""When each token was last used (``artsvc token list``), recorded without a write per request: an API process writes
a token's ``last_used_at`` at most once a minute, on a thread, never on the event loop and never before the request's
own work; the statement itself skips a row another process wrote within the minute. A failed write is logged and
forgotten: it must never fail the request it was noted for."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from service.store.tokens import LAST_USED_RESOLUTION, note_use

log = logging.getLogger(__name__)
MAX_REMEMBERED = 10_000  # tokens whose last write this process remembers; past it, it forgets them all and rewrites


class TokenUse:
    """One API process's memory of when it last wrote each token's ``last_used_at``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._written: dict[str, float] = {}  # token id -> time.monotonic() of the last write

    def note(self, token_id: str) -> None:
        """The token authenticated a request now: write that down if this process has not within a minute."""
        now = time.monotonic()
        if now - self._written.get(token_id, -float("inf")) < LAST_USED_RESOLUTION.total_seconds():
            return
        if len(self._written) >= MAX_REMEMBERED:
            self._written.clear()
        self._written[token_id] = now
        asyncio.get_running_loop().run_in_executor(None, self._write, token_id)

    def _write(self, token_id: str) -> None:
        try:
            with self._engine.begin() as connection:
                note_use(connection, token_id=token_id)
        except SQLAlchemyError as exc:
            log.warning("could not record the use of token %s: %s", token_id, exc)


def note_token_use(request: Request, token_id: str) -> None:
    """Note the use on the app's :class:`TokenUse`, made with the app's engine on the first use."""
    state = request.app.state
    if (token_use := getattr(state, "token_use", None)) is None:
        token_use = state.token_use = TokenUse(state.engine)
    token_use.note(token_id)
