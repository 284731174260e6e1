"""What tenant A sends in bench/api_flood.py, one coroutine per scenario; each runs until ``until`` (monotonic time)
and returns the status codes it saw (or the client error's name), by kind of request. A polite flooder: a 429 or
503 is followed by a pause of its ``Retry-After`` (at most a second), as a well-behaved client backs off.

- ``requests``: loops of ``GET /v1/jobs/{id}``, ``GET /v1/jobs`` and ``POST /v1/jobs`` (3:1:1) and SSE streams of A's
  job events, each reopened when it ends or is refused.
- ``slow-body``: raw connections that send a ``POST /v1/jobs`` head declaring ``Content-Length: 60000`` and then one
  byte, each opened again once answered; half carry A's token, half made-up tokens in four spellings of the scheme.
- ``inference``: loops of ``POST /v1/chat/completions`` on A's own job, each as large as asked (prompt words, ``n``,
  ``max_tokens``): whatever the server admits, refuses or queues is what is measured.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import httpx

QUEUED_SPEC = {"environment": "math", "training": {"max_steps": 1}}
TIMEOUT_S = 120  # far past any stall, so a stall shows as latency, not as a client-side timeout
SLOW_BODY_BYTES = 60_000  # declared, under the default body limit: only its slowness is wrong
SCHEMES = ("Bearer", "bearer", "BEARER", "BeArEr")
UNBOUNDED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


@dataclass(frozen=True)
class FloodSize:
    requests: int = 300  # request loops (requests)
    streams: int = 200  # SSE streams (requests)
    sockets: int = 64  # slow-body connections held at once (slow-body)
    chats: int = 16  # chat completion loops (inference)
    prompt_words: int = 1000  # words in each flood chat's user message (inference)
    n: int = 4  # choices per flood chat (inference)
    max_tokens: int = 512  # per flood chat (inference)


def outcome(response: httpx.Response | None, error: Exception | None = None) -> str:
    return str(response.status_code) if response is not None else type(error).__name__


async def back_off(status: str, retry_after: str | None = None) -> None:
    if status in ("429", "503"):
        await asyncio.sleep(min(float(retry_after or 1), 1.0))


async def requests_flood(base: str, token: str, job_id: str, until: float, size: FloodSize) -> Counter:
    counts: Counter = Counter()
    async with client(base, token, until) as http:
        await asyncio.gather(
            *(_request_loop(http, job_id, until, counts, index) for index in range(size.requests)),
            *(_stream_loop(http, job_id, until, counts) for _ in range(size.streams)),
        )
    return counts


async def _request_loop(http: httpx.AsyncClient, job_id: str, until: float, counts: Counter, index: int) -> None:
    """Three reads of A's job, one list, one submission per five, back to back."""
    round_ = index
    while time.monotonic() < until:
        kind = ("get", "get", "list", "get", "post")[round_ % 5]
        round_ += 1
        try:
            if kind == "get":
                response = await http.get(f"/v1/jobs/{job_id}")
            elif kind == "list":
                response = await http.get("/v1/jobs")
            else:
                response = await http.post("/v1/jobs", json=QUEUED_SPEC)
            counts[f"{kind} {outcome(response)}"] += 1
            await back_off(outcome(response), response.headers.get("retry-after"))
        except httpx.HTTPError as exc:
            counts[f"{kind} {outcome(None, exc)}"] += 1


async def _stream_loop(http: httpx.AsyncClient, job_id: str, until: float, counts: Counter) -> None:
    headers = {"Accept": "text/event-stream"}
    while time.monotonic() < until:
        try:
            async with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
                counts[f"stream {outcome(response)}"] += 1
                if response.status_code != 200:
                    await response.aread()
                    await back_off(outcome(response), response.headers.get("retry-after"))
                    continue
                async for _ in response.aiter_raw():
                    if time.monotonic() >= until:
                        break
        except httpx.HTTPError as exc:
            counts[f"stream {outcome(None, exc)}"] += 1
            await asyncio.sleep(0.2)


async def slow_body_flood(base: str, token: str, job_id: str, until: float, size: FloodSize) -> Counter:
    counts: Counter = Counter()
    host, port = base.removeprefix("http://").rsplit(":", 1)

    async def socket_loop(index: int) -> None:
        own = index % 2 == 0
        for round_ in range(1_000_000):
            if time.monotonic() >= until:
                return
            authorization = f"Bearer {token}" if own else f"{SCHEMES[index % 4]} artsvc_made-up-{index}-{round_}"
            status = await _slow_post(host, int(port), authorization, until)
            counts[f"{'tenant' if own else 'made-up'} {status}"] += 1
            await back_off(status)

    await asyncio.gather(*(socket_loop(index) for index in range(size.sockets)))
    return counts


async def _slow_post(host: str, port: int, authorization: str, until: float) -> str:
    """A head declaring ``SLOW_BODY_BYTES`` and one byte: the status the server answers, "held" if none came before
    ``until``, or the connection error's name."""
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {SLOW_BODY_BYTES}\r\n\r\n{{")  # fmt: skip
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(head.encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=max(until - time.monotonic(), 0.01))
        return line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"
    except TimeoutError:
        return "held"  # still waiting when the flood ended
    except OSError as exc:
        await asyncio.sleep(0.2)
        return type(exc).__name__
    finally:
        if writer is not None:
            writer.close()


async def inference_flood(base: str, token: str, job_id: str, until: float, size: FloodSize) -> Counter:
    counts: Counter = Counter()
    body = {"model": job_id, "messages": [{"role": "user", "content": "tell me more " * (size.prompt_words // 3)}],
            "n": size.n, "max_tokens": size.max_tokens}  # fmt: skip

    async def chat_loop(http: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            try:
                response = await http.post("/v1/chat/completions", json=body)
                counts[f"chat {outcome(response)}"] += 1
                await back_off(outcome(response), response.headers.get("retry-after"))
            except httpx.HTTPError as exc:
                counts[f"chat {outcome(None, exc)}"] += 1
                await asyncio.sleep(0.2)

    async with client(base, token, until) as http:  # chats still out at the end are dropped (the client goes away)
        loops = [asyncio.create_task(chat_loop(http)) for _ in range(size.chats)]
        await asyncio.wait(loops, timeout=max(until - time.monotonic(), 0) + 1)
        for loop in loops:
            if not loop.done():
                loop.cancel()
                counts["chat still out at the end"] += 1
        await asyncio.gather(*loops, return_exceptions=True)
    return counts


def client(base: str, token: str, until: float) -> httpx.AsyncClient:
    timeout = httpx.Timeout(TIMEOUT_S, read=max(until - time.monotonic(), 0) + TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=base, headers=headers, limits=UNBOUNDED, timeout=timeout)


FLOODS = {"requests": requests_flood, "slow-body": slow_body_flood, "inference": inference_flood}
