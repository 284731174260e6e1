"""Benchmark: what the policy server's HTTP costs the training process's event loop per round of concurrent rollout
requests, through ART's own inference client (``art.Model.openai_client``'s settings: a pool of up to 100,000
keep-alive connections), with connections kept alive after each response against closed (``Connection: close``,
``service.backends.serving.ClosingEachConnection``, what the policy server does), and against no connection at all:
the app called in the client's task (httpx's ASGI transport, ``LoopbackServing.direct_http_client``, what a job's
own rollouts use).

The server is the policy server's app (``openai_server.build_app`` with the real model's ``TemplateChat``) on
loopback under uvicorn; its generate answers every request of a round once all have arrived, as a decoding batch
would, with a 20-token reply and its logprobs. No model runs, so what is timed is HTTP, JSON and the client's pool.

    python bench/loopback_http.py [--requests 200] [--rounds 6] [--config-dir DIR] [--label LABEL]

Prints, per side, each round's wall and CPU seconds (the process's: client and server share one event loop, as in a
job); writes ``bench/results/loopback_http[_LABEL].json``. The first round of each side starts from an empty pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import httpx
import uvicorn
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from roofline import cpu  # noqa: E402
from service.backends.openai_server import Sample, build_app  # noqa: E402
from service.backends.serving import ClosingEachConnection  # noqa: E402
from service.backends.transformers.models import load_tokenizer, resolve_base_model  # noqa: E402
from service.backends.transformers.template_chat import TemplateChat  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 27 + 15? End with 'Final: N'."}]


async def side(mode: str, requests: int, rounds: int, tokenizer) -> list[tuple[float, float]]:
    arrived, released = 0, asyncio.Event()

    async def generate(model: str, request) -> tuple[str, list[Sample]]:
        nonlocal arrived
        arrived += 1
        if arrived % requests == 0:
            released.set()
        await released.wait()
        reply = Sample(text="Final: 42", token_ids=list(range(100, 120)), logprobs=[-0.5] * 20, finish_reason="stop")
        return model, [reply] * request.n

    app = build_app(generate, "key", TemplateChat(lambda _model: tokenizer))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    served = app if mode == "keep_alive" else ClosingEachConnection(app)
    server = uvicorn.Server(uvicorn.Config(served, log_level="warning", lifespan="off", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    limits = httpx.Limits(max_connections=100_000, max_keepalive_connections=100_000)  # ART's, art/model.py
    http = (httpx.AsyncClient(transport=httpx.ASGITransport(app=served, raise_app_exceptions=False)) if mode == "direct"
            else DefaultAsyncHttpxClient(timeout=httpx.Timeout(1200, connect=5.0), limits=limits))  # fmt: skip
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="key", http_client=http)
    times = []
    for _ in range(rounds):
        released.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*[client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=24,
                                                              logprobs=True) for _ in range(requests)])  # fmt: skip
        times.append((round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)))
    await client.close()
    server.should_exit = True
    await serving
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200, help="concurrent requests a round (a validation's 200)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--config-dir", type=Path, help="a tokenizer's directory; default: SmolLM2's, converted")
    parser.add_argument("--label", default="", help="appended to the results file's name")
    args = parser.parse_args()
    source = args.config_dir or resolve_base_model("SmolLM2-135M-Instruct", ROOT / ".artsvc" / "cache" / "base-models")
    tokenizer = load_tokenizer(source)
    result: dict = {"machine": cpu(), "requests": args.requests, "rounds": {}}
    modes = ("keep_alive", "close", "direct")
    for label in (*modes, *(f"{mode}_again" for mode in modes)):
        result["rounds"][label] = asyncio.run(side(label.removesuffix("_again"), args.requests, args.rounds, tokenizer))
        print(label, result["rounds"][label], flush=True)
    for label in modes:
        later = [cpu for run in (label, f"{label}_again") for _, cpu in result["rounds"][run][1:]]
        result[f"{label}_cpu_s_median_after_first_round"] = statistics.median(later)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    name = f"loopback_http{'_' + args.label if args.label else ''}.json"
    (ROOT / "bench" / "results" / name).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
