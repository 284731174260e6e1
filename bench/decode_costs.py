"""Benchmark: what a decode step of SmolLM2-135M-Instruct costs on this CPU, part by part (issue 31).

Three measurements, in the precision ``auto`` picks, two torch threads unless said:

- products: ``F.linear`` at a decode step's shapes (1 and 64 rows; the MLP's 576 -> 1536 and back, the adapter's
  576 -> 16 and 16 -> 576, on one thread too), bf16 and float32, microseconds a call; in bf16 also through the weight
  packed for oneDNN (packed_weights.py), at those rows, a prefill's 1,200 and 9,600, and for the vocabulary head,
  with whether the two agree bit for bit;
- attention: PyTorch's CPU flash kernel (what ``sdpa`` runs) against a plain bmm-softmax-bmm at decoding shapes
  (grouped queries: 3 KV heads of 3 query heads), microseconds a call and the largest error against float32;
- the step: the model with a nonzero adapter, as the sampler runs it (``adapter_in_base_dtype`` and
  ``adapter_as_sampled``), one decode step of 64 rows over ``--prompt`` cached positions and of one row, both also
  through PEFT's forward (the sampler before sampling_adapter.py) and with the base's products through weights packed
  for oneDNN (packed_weights.py, as the sampler runs them now), and the 64 rows split into two halves decoded at once
  on two threads of one intra-op thread each (data-parallel decoding).

    python bench/decode_costs.py [--prompt 150] [--steps 24] [--rounds 3] [--label NAME]

Medians over rounds; writes ``bench/results/decode_costs[_<label>].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as `artsvc train` runs (service/cpu.py); before torch loads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from roofline import cpu  # noqa: E402
from service.backends.transformers.batch_cache import growing_cache  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402
from service.backends.transformers.packed_weights import PackedWeights  # noqa: E402
from service.backends.transformers.precision import adapter_in_base_dtype  # noqa: E402
from service.backends.transformers.sampling_adapter import adapter_as_sampled  # noqa: E402

SHAPES = {"576->1536": (576, 1536), "1536->576": (1536, 576), "lora A 576->16": (576, 16), "lora B 16->576": (16, 576)}


def microseconds(call: Callable[[], object], repeats: int = 300) -> float:
    for _ in range(20):
        call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats * 1e6


@torch.inference_mode()
def products() -> dict[str, float]:
    timings = {}
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 64):
            for name, (inputs, outputs) in SHAPES.items():
                x, w = torch.randn(rows, inputs, dtype=dtype), torch.randn(outputs, inputs, dtype=dtype)
                for threads in (2, 1) if name.startswith("lora") else (2,):
                    torch.set_num_threads(threads)
                    key = f"{str(dtype).removeprefix('torch.')} {rows} rows {name}, {threads} threads"
                    timings[key] = round(microseconds(lambda: F.linear(x, w)), 1)
    torch.set_num_threads(2)
    return timings


@torch.inference_mode()
def packed_products() -> dict[str, dict[str, float | bool]]:
    """bf16 ``F.linear`` against the same product through the weight packed once as packed_weights.py packs it (at
    every row count: the sampler itself keeps more than ``SMALL_PRODUCT_ROWS`` rows plain)."""
    timings: dict[str, dict[str, float | bool]] = {}
    shapes = {**{k: v for k, v in SHAPES.items() if not k.startswith("lora")}, "head 576->49152": (576, 49152)}
    for rows in (1, 64, 1200, 9600):
        for name, (inputs, outputs) in shapes.items():
            if rows > 1200 and name.startswith("head"):
                continue
            x, w = torch.randn(rows, inputs, dtype=torch.bfloat16), torch.randn(outputs, inputs, dtype=torch.bfloat16)
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)

            def through_pack(x: torch.Tensor = x, packed: torch.Tensor = packed) -> torch.Tensor:
                return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

            repeats = 30 if rows > 64 or name.startswith("head") else 300
            timings[f"{rows} rows {name}"] = {
                "plain_us": round(microseconds(lambda: F.linear(x, w), repeats), 1),
                "packed_us": round(microseconds(through_pack, repeats), 1),
                "same_bits": bool(torch.equal(F.linear(x, w), through_pack())),
            }
    return timings


@torch.inference_mode()
def attention(dtype: torch.dtype) -> dict[str, dict[str, float]]:
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    results = {}
    for rows, keys in ((64, 160), (64, 200), (16, 400), (16, 1200)):
        q = torch.randn(rows, 3, 3, 64, dtype=dtype)
        k, v = torch.randn(rows, 3, keys, 64, dtype=dtype), torch.randn(rows, 3, keys, 64, dtype=dtype)
        mask = torch.zeros(rows, 1, 1, keys, dtype=dtype)

        def bmm() -> torch.Tensor:
            scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(0.125).add_(mask)
            return torch.matmul(scores.softmax(-1).to(v.dtype), v)

        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
        results[f"{rows} rows x {keys} keys"] = {
            "flash_us": round(microseconds(lambda: flash(q, k, v, attn_mask=mask), 100), 1),
            "bmm_us": round(microseconds(bmm, 100), 1),
            "flash_error": (flash(q, k, v, attn_mask=mask)[0].float() - exact).abs().max().item(),
            "bmm_error": (bmm().float() - exact).abs().max().item(),
        }
    return results


def decode_ms(model: torch.nn.Module, prompt: torch.Tensor, steps: int, threads: int | None = None,
              out: list[float] | None = None, direct: bool = True, packed: bool = False) -> float:  # fmt: skip
    """Median milliseconds of ``steps`` greedy decode steps after a prefill of ``prompt`` (on ``threads`` intra-op
    threads of the calling thread where given; the adapter through PEFT's forward unless ``direct``; the base's
    products through packed weights if ``packed``)."""
    if threads is not None:
        torch.set_num_threads(threads)
    times = []
    adapter = adapter_as_sampled(model, PackedWeights() if packed else None) if direct else contextlib.nullcontext()
    with torch.inference_mode(), adapter_in_base_dtype(model), adapter:
        first = model(input_ids=prompt, past_key_values=growing_cache(), use_cache=True, logits_to_keep=1)
        cache, token = first.past_key_values, first.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(steps):
            started = time.perf_counter()
            token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - started)
    median = statistics.median(times) * 1000
    if out is not None:
        out.append(median)
    return median


def steps(model: torch.nn.Module, prompt: torch.Tensor, count: int, rounds: int) -> dict[str, float]:
    sides: dict[str, list[float]] = {"64 rows": [], "1 row": [], "64 rows through PEFT": [], "1 row through PEFT": [],
                                     "64 rows as two halves on two threads": [], "64 rows, base packed": [],
                                     "1 row, base packed": []}  # fmt: skip
    for round_ in range(rounds + 1):  # the first round warms up
        whole = decode_ms(model, prompt, count)
        one = decode_ms(model, prompt[:1], count)
        whole_peft = decode_ms(model, prompt, count, direct=False)
        one_peft = decode_ms(model, prompt[:1], count, direct=False)
        halves: list[float] = []
        workers = [threading.Thread(target=decode_ms, args=(model, prompt[i::2], count, 1, halves)) for i in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        torch.set_num_threads(2)
        whole_packed = decode_ms(model, prompt, count, packed=True)
        one_packed = decode_ms(model, prompt[:1], count, packed=True)
        if round_:
            for side, ms in zip(sides, (whole, one, whole_peft, one_peft, max(halves), whole_packed, one_packed)):
                sides[side].append(ms)
    return {side: round(statistics.median(ms), 1) for side, ms in sides.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=150)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = PolicyEngine(Path(tmp) / "model", resolve_base_model("SmolLM2-135M-Instruct", ROOT / ".artsvc" / "cache"))
        torch.manual_seed(0)
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.002)
        prompt = torch.randint(0, engine.model.get_output_embeddings().weight.shape[0], (64, args.prompt))
        result = {"machine": cpu(), "dtype": str(engine.dtype), **vars(args), "products_us": products(),
                  "packed_products_us": packed_products() if PackedWeights.applies(torch.ones(1, dtype=torch.bfloat16))
                  else None,
                  "attention": attention(engine.dtype),
                  "decode_step_ms": steps(engine.model, prompt, args.steps, args.rounds)}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    out = ROOT / "bench" / "results" / f"decode_costs{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
