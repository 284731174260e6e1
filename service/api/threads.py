"""Store work of an async route, run on a request thread in one pass of the event loop.

Under load every pass of the loop runs each request that became ready since the last, so an ``await`` that yields
costs a whole pass: about 15 ms with 50 connections back to back (each GET about 0.3 ms). Starlette's
``run_in_threadpool`` (anyio's ``to_thread.run_sync``) yields three times for one call: a checkpoint, another in its
``CapacityLimiter``, then the result. A ``POST /v1/jobs`` that needed 2 ms of CPU took about 65 ms while GETs kept the
loop busy. ``in_request_thread`` takes the limiter's token without yielding when one is free and hands the call to
the app's executor (``app.state.request_threads``): one pass, for the result.

The threads stay sized to the database pool: the app's executor has as many threads as anyio's default limiter has
tokens, and each call holds one of those tokens, shared with the sync routes and dependencies FastAPI runs on anyio's
threads, so no more threads than connections wait for the pool. A caller cancelled while its call runs gives its token
back at once and its thread finishes the call, as with anyio's ``abandon_on_cancel``. The live event streams' polls
stay on ``run_in_threadpool``: twice a second, a pass more costs them nothing, and a stream can outlive the app's
executor at shutdown.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


def request_threads(count: int) -> ThreadPoolExecutor:
    """The app's executor, ``count`` threads (started as needed), and anyio's default limiter set to as many tokens.
    Call it on the loop that serves the app (its lifespan); shut the executor down when the app stops."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = count
    return ThreadPoolExecutor(max_workers=count, thread_name_prefix="artsvc-request")


async def in_request_thread(threads: Executor, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on one of ``threads`` (the app's ``request_threads``), holding a token of anyio's
    default limiter while it runs (see the module docstring)."""
    limiter, borrower = anyio.to_thread.current_default_thread_limiter(), object()
    try:
        limiter.acquire_on_behalf_of_nowait(borrower)
    except anyio.WouldBlock:  # every thread is busy: wait for a token like any other caller
        await limiter.acquire_on_behalf_of(borrower)
    try:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(threads, call)
    finally:
        limiter.release_on_behalf_of(borrower)
