"""Benchmark: a float32 model's products through weights packed for oneDNN (packed_weights.py) against MKL's plain
products, at a decode step's rows, and what that does to the main job's validation sweep (issue 31, float32 hosts).

Two measurements, two torch threads, float32, rounds alternated (these machines drift by tens of percent within
minutes, so only sides of one round are compared; in the sweep each side goes first in turn):

- products: ``F.linear`` against ``mkldnn._linear_pointwise`` over the weight packed once for 64 rows (as the sampler
  packs it), at 1, 8, 16 and 64 rows, for each of SmolLM2-135M's shapes: q and o (576 -> 576), k and v (576 -> 192),
  gate and up (576 -> 1,536), down (1,536 -> 576) and the vocabulary head (576 -> 49,152); microseconds a call,
  GFLOP/s, and the largest difference between the two;
- the sweep: the math environment's first ``--examples`` validation problems, sampled and greedy side by side in
  64-row batches as ``service.training.validation`` asks for them, through the transformers backend's sampler with
  nothing packed, with the head alone packed (the service's float32 rule) and with every weight packed; seconds, the
  packed copies' bytes, and how many replies each side drew as the unpacked side did.

    python bench/packed_head.py [--examples 100] [--rounds 4] [--label NAME]

Writes ``bench/results/packed_head[_<label>].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from env_rl import machine  # noqa: E402
from service.backends.transformers import packed_weights  # noqa: E402

SHAPES = {"q, o": (576, 576), "k, v": (576, 192), "gate, up": (576, 1536), "down": (1536, 576), "head": (576, 49152)}
ROWS = (1, 8, 16, 64)
SIDES = ("nothing packed", "head packed (the service)", "every weight packed")


def _seconds_a_call(call: Callable[[], object], flops: int) -> float:
    repeats = max(3, int(1e8 / flops))
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats


@torch.inference_mode()
def products(rounds: int) -> dict[str, dict[str, float]]:
    results = {}
    for name, (inputs, outputs) in SHAPES.items():
        weight = torch.randn(outputs, inputs)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
        for rows in ROWS:
            x, flops = torch.randn(rows, inputs), 2 * rows * inputs * outputs

            def through_pack(x: torch.Tensor = x, packed: torch.Tensor = packed) -> torch.Tensor:
                return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

            plain, onednn = [], []
            for _ in range(rounds + 1):  # the first round warms up
                plain.append(_seconds_a_call(lambda: F.linear(x, weight), flops))
                onednn.append(_seconds_a_call(through_pack, flops))
            mkl, packed_s = statistics.median(plain[1:]), statistics.median(onednn[1:])
            difference = F.linear(x, weight) - through_pack()
            results[f"{name} {inputs}->{outputs}, {rows} rows"] = {
                "mkl_us": round(mkl * 1e6, 1), "packed_us": round(packed_s * 1e6, 1),
                "mkl_gflops": round(flops / mkl / 1e9, 1), "packed_gflops": round(flops / packed_s / 1e9, 1),
                "packed_over_mkl": round(packed_s / mkl, 2), "max_abs_difference": difference.abs().max().item(),
            }  # fmt: skip
            print(name, rows, results[f"{name} {inputs}->{outputs}, {rows} rows"], flush=True)
    return results


def sweep(examples: int, rounds: int) -> dict:
    from environments.math.env import MathEnvironment
    from service.backends.transformers import chat
    from service.backends.transformers.engine import PolicyEngine
    from service.backends.transformers.generation import SamplingRequest
    from service.backends.transformers.models import resolve_base_model
    from service.runner.seeding import derive_seed

    with tempfile.TemporaryDirectory() as folder:
        base = resolve_base_model("SmolLM2-135M-Instruct", ROOT / ".artsvc" / "cache")
        engine = PolicyEngine(Path(folder) / "model", base, device=torch.device("cpu"), dtype=torch.float32)
        torch.manual_seed(0)
        with torch.no_grad():  # a trained-looking adapter: both of its products carry values
            for name, param in engine.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.002)
        env = MathEnvironment()
        rows = list(env.scenarios("val"))[:examples]
        prompts = [tuple(chat.render_prompt(engine.tokenizer, env.opening(row), None)) for row in rows]
        seeds = [derive_seed(0, "val", row["id"]) for row in rows]
        order = [SamplingRequest(prompt_ids=prompts[i], temperature=t, max_tokens=24, seed=seeds[i])
                 for i in range(len(rows)) for t in (1.0, 0.0)]  # fmt: skip
        service_rule = packed_weights.PackedWeights.applies
        rules = {SIDES[0]: lambda weight, head=False: False, SIDES[1]: service_rule,
                 SIDES[2]: lambda weight, head=False: weight.dtype == torch.float32}  # fmt: skip
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        replies: dict[str, list[tuple[int, ...]]] = {}
        packed_bytes: dict[str, int] = {}
        try:
            for round_ in range(rounds + 1):  # the first round warms up
                for side in SIDES[round_ % 3 :] + SIDES[: round_ % 3]:  # each side first in turn
                    packed_weights.PackedWeights.applies = staticmethod(rules[side])  # type: ignore[method-assign]
                    started, drawn = time.perf_counter(), []
                    for start in range(0, len(order), 64):
                        drawn += [samples[0].token_ids for samples in engine.generate(order[start : start + 64])]
                    elapsed = time.perf_counter() - started
                    packed_bytes[side] = sum(weight.numel() * weight.element_size()  # a pack is its weight's size
                                             for weight, _, _ in engine.sampler.packed._packs.values())  # fmt: skip
                    engine.sampler.packed.release()  # as a training step does between a job's sweeps
                    if round_:
                        seconds[side].append(elapsed)
                    replies[side] = [tuple(tokens) for tokens in drawn]
                    print(f"round {round_}, {side}: {elapsed:.2f} s", flush=True)
        finally:
            packed_weights.PackedWeights.applies = staticmethod(service_rule)  # type: ignore[method-assign]
    unpacked = seconds[SIDES[0]]
    return {
        "examples": examples, "requests": len(order), "seconds": seconds,
        "median_s": {side: round(statistics.median(s), 2) for side, s in seconds.items()},
        "median_ratio_to_unpacked": {side: round(statistics.median(a / b for a, b in zip(s, unpacked)), 3)
                                     for side, s in seconds.items()},
        "packed_mb": {side: round(b / 1e6, 1) for side, b in packed_bytes.items()},
        "replies_as_unpacked": {side: sum(a == b for a, b in zip(r, replies[SIDES[0]])) for side, r in replies.items()},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    torch.set_num_threads(2)
    report = {"machine": machine(), "threads": torch.get_num_threads(), "products": products(args.rounds),
              "sweep": sweep(args.examples, args.rounds)}  # fmt: skip
    print(json.dumps(report["sweep"], indent=2))
    out = ROOT / "bench" / "results" / f"packed_head{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
