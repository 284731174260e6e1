"""Benchmark: what the LoRA adapter costs a decode step of the sampler, on SmolLM2-135M-Instruct (issue 31).

The policy samples through PEFT: every adapted linear layer (7 a layer, 30 layers) runs its base product, then casts
its input to the adapter's float32, runs A and B, scales, adds and casts back: about 1,200 more small operations per
decode step, where the arithmetic is r=16 against 576-1536 (a few percent of the step's FLOPs). This times one decode
step of a batch like a math step's rollouts (``--rows`` rows, a cache of ``--prompt`` positions) three ways, in the
precision ``auto`` picks: the adapter as trained (float32 weights, today), the adapter off (``disable_adapter``: the
floor the adapter's path adds to), and the adapter's weights cast to the base's dtype (no casts of the activations).

    python bench/lora_decode.py [--rows 64] [--prompt 150] [--steps 20] [--rounds 3] [--label NAME]

Medians of each side's decode steps over alternated rounds (after one untimed); writes
``bench/results/lora_decode[_<label>].json``.
"""

from __future__ import annotations

import argparse
import contextlib
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

from roofline import cpu  # noqa: E402
from service.backends.transformers.batch_cache import growing_cache  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402


def decode_ms(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> float:
    """Median milliseconds of ``steps`` greedy decode steps after a prefill of ``prompt``."""
    with torch.no_grad():  # the sampler's cache: decoded states written in place (batch_cache.GrowingLayer)
        out = model(input_ids=prompt, past_key_values=growing_cache(), use_cache=True, logits_to_keep=1)
        cache, token, times = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True), []
        for _ in range(steps):
            started = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=150)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    machine = cpu()
    print(json.dumps(machine))
    with tempfile.TemporaryDirectory() as tmp:
        engine = PolicyEngine(Path(tmp) / "model", resolve_base_model("SmolLM2-135M-Instruct", Path(tmp) / "cache"))
        model = engine.model
        torch.manual_seed(0)
        adapter = {name: p for name, p in model.named_parameters() if "lora_" in name}
        for name, p in adapter.items():  # B starts at zero; a trained adapter's does not (the cost is the same)
            if "lora_B" in name:
                p.data.normal_(0, 0.01)
        trained = {name: p.data for name, p in adapter.items()}
        prompt = torch.randint(0, model.get_output_embeddings().weight.shape[0], (args.rows, args.prompt))

        @contextlib.contextmanager
        def in_base_dtype():
            for name, p in adapter.items():
                p.data = trained[name].to(engine.dtype)
            try:
                yield
            finally:
                for name, p in adapter.items():
                    p.data = trained[name]

        sides: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
            "adapter_float32": contextlib.nullcontext, "adapter_off": model.disable_adapter,
            "adapter_in_base_dtype": in_base_dtype}  # fmt: skip
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds + 1):
            for side, context in sides.items():
                with context():
                    ms = decode_ms(model, prompt, args.steps)
                if round_:  # the first round warms up
                    times[side].append(ms)
        medians = {side: statistics.median(ms) for side, ms in times.items()}
    result = {"machine": machine, "dtype": str(engine.dtype), **vars(args), "decode_step_ms": times,
              "median_ms": medians, "adapter_share": 1 - medians["adapter_off"] / medians["adapter_float32"]}  # fmt: skip
    for side, ms in medians.items():
        print(f"{side:24s} {ms:7.1f} ms a decode step of {args.rows} rows")
    print(f"the adapter's share of a decode step: {result['adapter_share']:.0%}")
    out = ROOT / "bench" / "results" / f"lora_decode{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
