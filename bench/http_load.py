"""An HTTP load generator, run as its own process so the load never shares the server's interpreter.

Opens ``--connections`` keep-alive connections, spread evenly over the bearer tokens given (one client
session per token: the server caps requests in progress per credential), and on each connection sends
``GET --get-path``, with every ``--post-every``-th request a ``POST --post-path`` of ``--post-body`` instead,
for ``--seconds``:

- closed loop (``--rate 0``, the default): each connection sends its next request as soon as the last is
  answered, so the server runs flat out and, by Little's law, mean latency is connections / throughput: it
  measures how much the server can do, and its latencies are mostly queueing in front of it;
- open loop (``--rate R``): the connections together send R requests a second on a fixed schedule, and each
  latency counts from the moment its request was due, so a server that falls behind is charged for the wait
  (no coordinated omission): it measures what a client sees at that load.
 Prints one JSON object: requests, errors by status,
throughput, and p50/p90/p99/max latency per endpoint (``--with-samples``: every latency too). aiohttp, not httpx: its C parser keeps the
generator's own cost per request small, so more of the two cores is left to the server.

    python bench/http_load.py --base http://127.0.0.1:8000 --tokens T1,T2 --get-path /v1/jobs/ID --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter

import aiohttp


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    ms = [1000 * v for v in values]
    return {
        "count": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(percentile(ms, 0.90), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(max(ms), 1),
    }


async def run(args: argparse.Namespace) -> dict:
    tokens = args.tokens.split(",")
    body = json.loads(args.post_body) if args.post_body else None
    latencies: dict[str, list[float]] = {f"GET {args.get_label}": [], f"POST {args.post_path}": []}
    errors: Counter[str] = Counter()
    per_token = -(-args.connections // len(tokens))
    sessions = [
        aiohttp.ClientSession(
            args.base,
            connector=aiohttp.TCPConnector(limit=per_token),
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=60),
        )
        for token in tokens
    ]
    begun = time.perf_counter()
    deadline = begun + args.seconds
    interval = args.connections / args.rate if args.rate > 0 else 0.0  # between one connection's requests

    async def connection(index: int, session: aiohttp.ClientSession) -> None:
        sent = 0
        due = begun + index * interval / args.connections  # staggered: the connections' requests interleave
        while due < deadline:
            sent += 1
            posting = args.post_every > 0 and (sent + index) % args.post_every == 0  # the POSTs spread, not in rounds
            name = f"POST {args.post_path}" if posting else f"GET {args.get_label}"
            if interval:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                started, due = due, due + interval
            else:
                started = due = time.perf_counter()
            try:
                request = session.post(args.post_path, json=body) if posting else session.get(args.get_path)
                async with request as response:
                    await response.read()
                    if response.status >= 400:
                        errors[f"{name}: {response.status}"] += 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                errors[f"{name}: {type(exc).__name__}"] += 1
            latencies[name].append(time.perf_counter() - started)

    try:
        await asyncio.gather(*(connection(i, sessions[i % len(sessions)]) for i in range(args.connections)))
    finally:
        for session in sessions:
            await session.close()
    elapsed = time.perf_counter() - begun
    total = sum(map(len, latencies.values()))
    return {
        "connections": args.connections,
        "offered_per_s": args.rate or None,
        "tokens": len(tokens),
        "seconds": round(elapsed, 1),
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "errors": sum(errors.values()),
        "errors_by_kind": dict(errors),
        "endpoints": {name: summary(values) for name, values in latencies.items() if values},
        "latencies_s": latencies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--tokens", required=True, help="comma-separated bearer tokens")
    parser.add_argument("--get-path", required=True)
    parser.add_argument("--get-label", default="/v1/jobs/{id}", help="the GET's name in the report")
    parser.add_argument("--post-path", default="/v1/jobs")
    parser.add_argument("--post-body", default="", help="JSON body of the POSTs")
    parser.add_argument("--post-every", type=int, default=0, help="every n-th request is a POST (0: none)")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=0, help="requests a second over all connections (0: closed loop)")
    parser.add_argument("--with-samples", action="store_true", help="include every latency (seconds), to merge runs")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if not args.with_samples:
        del result["latencies_s"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
