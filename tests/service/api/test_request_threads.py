"""An async route's store work on a request thread (service/api/threads.py): in one pass of the event loop, on the
app's threads, within the same token limit as the sync routes, and never keeping a token after the call."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Generator
from typing import Any

import anyio.to_thread
import pytest

from service.api.threads import in_request_thread, request_threads


class Suspensions:
    """Awaits ``awaitable`` and counts the times it gave the event loop back to its caller (each a pass of the loop
    under load)."""

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable, self.count = awaitable, 0

    def __await__(self) -> Generator[Any, Any, Any]:
        inner, sent = self.awaitable.__await__(), None
        while True:
            try:
                yielded = inner.send(sent)
            except StopIteration as done:
                return done.value
            self.count += 1
            sent = yield yielded


def thread_name() -> str:
    return threading.current_thread().name


@pytest.mark.asyncio
async def test_a_call_with_a_free_thread_gives_the_loop_back_once_and_runs_on_the_apps_threads():
    threads = request_threads(4)
    try:
        call = Suspensions(in_request_thread(threads, thread_name))
        assert (await call).startswith("artsvc-request")
        assert call.count == 1  # only for the result (anyio's run_sync yields three times)
        assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
    finally:
        threads.shutdown()


@pytest.mark.asyncio
async def test_a_call_waits_while_every_token_is_held_and_gives_its_token_back_when_it_fails():
    threads = request_threads(1)
    limiter = anyio.to_thread.current_default_thread_limiter()
    try:
        await limiter.acquire()  # a sync route holds the only thread
        waiting = asyncio.ensure_future(in_request_thread(threads, int, "not a number"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        limiter.release()
        with pytest.raises(ValueError, match="not a number"):
            await waiting
        assert limiter.borrowed_tokens == 0
        assert await in_request_thread(threads, int, "7") == 7
    finally:
        threads.shutdown()
