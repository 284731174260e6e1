"""Benchmark: the sampler's adapted layers through PEFT's forward against computed directly (sampling_adapter.py).

A math step's rollout batch on SmolLM2-135M-Instruct, through the transformers backend's sampler in the precision
``auto`` picks: the first ``--prompts`` training problems, ``--samples`` each at temperature 1, up to 24 tokens (the
math environment's limit), fixed seeds, with a nonzero adapter (B drawn small, as a trained one is). The sides
alternate in one process, ``--rounds`` timed rounds after an untimed one: "peft", every adapted layer through PEFT's
forward under the trainer's autocast (the sampler before sampling_adapter.py); "unpacked", the adapter computed
directly over the base's plain products (the sampler before packed_weights.py); "direct", the sampler as it is. The
first two must draw the same tokens and logprobs bit for bit; the third's products may round otherwise (a bfloat16
base's), and the bench reports how many tokens it drew alike and its largest logprob difference.

    python bench/sampling_adapter.py [--prompts 8] [--samples 8] [--rounds 5] [--precision float32] [--label NAME]

Writes ``bench/results/sampling_adapter[_<label>].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # as `artsvc train` runs (service/cpu.py); before torch loads

import torch  # noqa: E402

from environments.math.env import MAX_TOKENS, MathEnvironment  # noqa: E402
from roofline import cpu  # noqa: E402
from service.backends.transformers import chat, generation  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.generation import SamplingRequest  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402
from service.backends.transformers.precision import resolve  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = resolve_base_model("SmolLM2-135M-Instruct", ROOT / ".artsvc" / "cache")
        engine = PolicyEngine(Path(tmp) / "model", base, dtype=resolve(args.precision, torch.device("cpu")))
        torch.manual_seed(0)
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.002)
        env = MathEnvironment()
        scenarios = list(env.scenarios("train"))[: args.prompts]
        requests = [SamplingRequest(prompt_ids=tuple(chat.render_prompt(engine.tokenizer, env.opening(s), None)),
                                    n=args.samples, max_tokens=MAX_TOKENS, seed=i) for i, s in enumerate(scenarios)]  # fmt: skip
        direct = generation.adapter_as_sampled
        sides = {"peft": lambda model, packed: contextlib.nullcontext(),
                 "unpacked": lambda model, packed: direct(model), "direct": direct}  # fmt: skip
        times: dict[str, list[float]] = {side: [] for side in sides}
        drawn: dict[str, list] = {}
        for round_ in range(args.rounds + 1):
            for side, context in sides.items():
                generation.adapter_as_sampled = context
                started = time.perf_counter()
                samples = engine.sampler.generate(requests, weights=(side, round_))  # nothing cached is reused
                if round_:
                    times[side].append(time.perf_counter() - started)
                drawn[side] = [(s.token_ids, s.logprobs) for per_request in samples for s in per_request]
            generation.adapter_as_sampled = direct
            print(f"round {round_}: " + ", ".join(f"{side} {t[-1]:.2f} s" for side, t in times.items() if t), flush=True)
    medians = {side: statistics.median(t) for side, t in times.items()}
    packed_alike = [(a == b, max((abs(x - y) for x, y in zip(la, lb)), default=0.0))
                    for (a, la), (b, lb) in zip(drawn["unpacked"], drawn["direct"])]  # fmt: skip
    result = {"machine": cpu(), "dtype": str(engine.dtype), **vars(args), "seconds": times, "median_s": medians,
              "speedup": medians["peft"] / medians["direct"],
              "speedup_of_packing": medians["unpacked"] / medians["direct"],
              "tokens": sum(len(t) for t, _ in drawn["direct"]),
              "identical": drawn["peft"] == drawn["unpacked"],
              "packed_samples_alike": f"{sum(same for same, _ in packed_alike)} of {len(packed_alike)}",
              "packed_largest_logprob_difference": max(d for _, d in packed_alike)}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "seconds")}, indent=2))
    out = ROOT / "bench" / "results" / f"sampling_adapter{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
