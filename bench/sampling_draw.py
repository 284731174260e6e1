"""Benchmark: the sampler's draw of a decoded token for a batch (``generation._choose``), this checkout's against
another's, on SmolLM2's vocabulary (49,152) and random logits, in one process, sides alternated.

    python bench/sampling_draw.py --before /path/to/old/checkout [--rows 64] [--rounds 30] [--label NAME]

Three batches: every row at temperature 1 (a rollout batch), half greedy and half at 1 (a validation batch), every
row at 0.7. Reports each side's median milliseconds and whether both drew the same tokens (they must: the draws come
from the rows' own generators). Writes ``bench/results/sampling_draw[_<label>].json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402

from roofline import cpu  # noqa: E402
from service.backends.openai_server import Sample  # noqa: E402
from service.backends.transformers import generation  # noqa: E402

VOCABULARY = 49_152
BATCHES = {"temperature 1": [1.0], "half greedy": [1.0, 0.0], "temperature 0.7": [0.7]}


def load_generation(checkout: Path) -> ModuleType:
    """``checkout``'s generation.py as a module of its own (its imports resolve to this checkout's packages)."""
    spec = importlib.util.spec_from_file_location("generation_before", checkout / "service/backends/transformers/generation.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def draw(module: ModuleType, logits: torch.Tensor, temperatures: list[float]) -> tuple[float, list[int]]:
    rows = [module._Row(request=module.SamplingRequest(prompt_ids=(1,), temperature=t), prompt=0,
                        generator=torch.Generator().manual_seed(i), sample=Sample(context_tokens=1))
            for i, t in enumerate(temperatures)]  # fmt: skip
    values = logits.clone()
    with torch.inference_mode():
        started = time.perf_counter()
        tokens = module._choose(values, rows)
        return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    sides = {"before": load_generation(args.before.resolve()), "after": generation}
    logits = torch.randn(args.rows, VOCABULARY, generator=torch.Generator().manual_seed(0)) * 3
    result: dict = {"machine": cpu(), "rows": args.rows, "rounds": args.rounds, "batches": {}}
    for batch, pattern in BATCHES.items():
        temperatures = (pattern * args.rows)[: args.rows]
        times: dict[str, list[float]] = {side: [] for side in sides}
        drawn: dict[str, list[int]] = {}
        for _ in range(args.rounds):
            for side, module in sides.items():
                seconds, drawn[side] = draw(module, logits, temperatures)
                times[side].append(seconds)
        medians = {side: 1000 * statistics.median(t[1:]) for side, t in times.items()}  # the first round warms up
        result["batches"][batch] = {"median_ms": medians, "ratio": medians["before"] / medians["after"],
                                    "same_tokens": drawn["before"] == drawn["after"]}  # fmt: skip
        print(f"{batch:16s} before {medians['before']:6.2f} ms, after {medians['after']:6.2f} ms, "
              f"same tokens: {drawn['before'] == drawn['after']}")  # fmt: skip
    out = ROOT / "bench" / "results" / f"sampling_draw{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
