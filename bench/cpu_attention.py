"""Benchmark: attention over a training row on the CPU, three ways, forward and forward+backward.

The warm start's profile on an AMD CPU put a quarter of its time in MKL's float32 SGEMM under PyTorch's CPU flash
attention (MKL runs bf16 products there as float32 on AMD). This times the alternatives on the shapes of an email
training row (SmolLM2-135M: 9 query heads on 3 KV heads of 64, laid as ``attention.grouped_sdpa_attention`` lays
them: 3 query rows a position per KV head) under a causal mask:

- ``flash_bf16``: ``scaled_dot_product_attention`` in bf16 (the service's training pass);
- ``flash_f32``: the same in float32;
- ``matmul_bf16``: explicit bf16 products with a float32 softmax.

    python bench/cpu_attention.py [--lengths 800 1554 2300] [--rounds 3]

Medians of ``--rounds`` after an untimed one. Writes ``bench/results/cpu_attention.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_rl import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_attention.json"
KV_HEADS, N_REP, DIM = 3, 3, 64


def flash_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flash_f32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).to(q.dtype)


def matmul_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = (torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5).float().masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, -1).to(q.dtype), v)


def timed(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], mask: torch.Tensor, *, rounds: int,
          backward: bool) -> float:  # fmt: skip
    seconds = []
    for _ in range(rounds + 1):
        q, k, v = (t.detach().clone().requires_grad_(backward) for t in inputs)
        started = time.perf_counter()
        out = fn(q, k, v, mask)
        if backward:
            out.float().sum().backward()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[800, 1554, 2300])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for length in args.lengths:
        q = torch.randn(1, KV_HEADS, N_REP * length, DIM, dtype=torch.bfloat16)
        k, v = (torch.randn(1, KV_HEADS, length, DIM, dtype=torch.bfloat16) for _ in range(2))
        mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).repeat(N_REP, 1)[None, None]
        for fn in (flash_bf16, flash_f32, matmul_bf16):
            row = {"positions": length, "kind": fn.__name__,
                   "forward_ms": 1000 * timed(fn, (q, k, v), mask, rounds=args.rounds, backward=False),
                   "forward_backward_ms": 1000 * timed(fn, (q, k, v), mask, rounds=args.rounds, backward=True)}  # fmt: skip
            rows.append({key: round(value, 1) if isinstance(value, float) else value for key, value in row.items()})
            print(json.dumps(rows[-1]), flush=True)
    RESULTS.write_text(json.dumps({"machine": machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                                   "rounds": args.rounds, "rows": rows}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
