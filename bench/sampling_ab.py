"""One validation sweep of the main job, sampled by two checkouts of this service in one run: where the sampler's
changes show by themselves, on the real model, with nothing else of the job around them.

    python bench/sampling_ab.py --before /path/to/old/checkout [--after .] [--examples 100] [--rounds 2]

Each checkout runs in its own child process (its own code, this venv): it loads SmolLM2-135M-Instruct through the
transformers backend's ``PolicyEngine`` (its attention, its precision, its sampler) with a fresh adapter, then
samples the math environment's first ``--examples`` validation problems at temperature 1 and greedily, as
``service.training.validation`` asks for them: the old code as two passes of 64-row batches, the new side by side in
64-row batches (``--split-passes`` on both sides compares the sampler alone). Rounds alternate before/after; each
reports wall seconds, CPU seconds of the process (CPU%), tokens sampled, and the greedy answers' agreement between
the two (the same weights: greedy replies should match token for token, up to float noise). Writes
``bench/results/sampling_ab[_LABEL].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# torch's threads wait as they do under `artsvc train` (service/cpu.py; they slept at once under an older default)
ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "GOMP_SPINCOUNT": "10000"}
BATCH_ROWS = 64  # the transformers backend's MAX_BATCH_ROWS


def child(checkout: Path, examples: int, interleave: bool, out: Path) -> None:
    """In a child that imports ``checkout``'s code: one sweep, timed."""
    import torch

    from environments.math.env import MathEnvironment
    from service.backends.transformers import chat
    from service.backends.transformers.engine import PolicyEngine
    from service.backends.transformers.generation import SamplingRequest
    from service.backends.transformers.models import resolve_base_model
    from service.runner.seeding import derive_seed

    data = Path(os.environ["AB_DATA"])
    base = resolve_base_model("SmolLM2-135M-Instruct", data / "base-models")
    engine = PolicyEngine(Path(tempfile.mkdtemp(dir=data)), base)
    env = MathEnvironment()
    rows = list(env.scenarios("val"))[:examples]
    prompts = [tuple(chat.render_prompt(engine.tokenizer, env.opening(row), None)) for row in rows]
    seeds = [derive_seed(0, "val", row["id"]) for row in rows]

    def request(i: int, temperature: float) -> SamplingRequest:
        return SamplingRequest(prompt_ids=prompts[i], temperature=temperature, max_tokens=24, seed=seeds[i])

    if interleave:
        order = [request(i, t) for i in range(len(rows)) for t in (1.0, 0.0)]
    else:
        order = [request(i, 1.0) for i in range(len(rows))] + [request(i, 0.0) for i in range(len(rows))]
    cpu, wall = time.process_time(), time.perf_counter()
    samples = []
    for start in range(0, len(order), BATCH_ROWS):
        samples += [s[0] for s in engine.generate(order[start : start + BATCH_ROWS])]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    greedy = [s.token_ids for r, s in zip(order, samples) if r.temperature == 0.0]
    out.write_text(json.dumps({"wall_s": wall, "cpu_s": cpu, "tokens": sum(len(s.token_ids) for s in samples),
                               "greedy": greedy, "threads": torch.get_num_threads()}))  # fmt: skip


def run(checkout: Path, examples: int, interleave: bool, data: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", str(checkout), str(examples), str(int(interleave)), out.name]
        subprocess.run(command, cwd=checkout, env={**os.environ, **ENV, "AB_DATA": str(data)}, check=True)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":  # the checkout's code first on the path, then its sweep
        sys.path.insert(0, sys.argv[2])
        child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", Path(sys.argv[5]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--split-passes", action="store_true", help="both sides sample the two passes one after another")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="artsvc-sampling-ab-") as data:
        for round_ in range(args.rounds):
            for side, checkout, interleave in (("before", args.before, False), ("after", args.after, not args.split_passes)):
                result = run(checkout.resolve(), args.examples, interleave, Path(data))
                results[side].append(result)
                print(f"round {round_} {side:6}: {result['wall_s']:6.1f} s wall, CPU {100 * result['cpu_s'] / result['wall_s']:.0f}%, "
                      f"{result['tokens']} tokens", flush=True)  # fmt: skip
    median = {side: statistics.median(r["wall_s"] for r in rs) for side, rs in results.items()}
    same = sum(a == b for a, b in zip(results["before"][0]["greedy"], results["after"][0]["greedy"]))
    summary = {"machine": {"cpu": _cpu_model(), "flags": _vector_flags(), "python": platform.python_version()},
               "examples": args.examples, "rounds": args.rounds, "split_passes": args.split_passes,
               "median_wall_s": median, "speedup": median["before"] / median["after"],
               "greedy_replies_identical": f"{same} of {args.examples}",
               "runs": {side: [{k: v for k, v in r.items() if k != "greedy"} for r in rs] for side, rs in results.items()}}  # fmt: skip
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    name = f"sampling_ab{'_' + args.label if args.label else ''}.json"
    (ROOT / "bench" / "results" / name).write_text(json.dumps(summary, indent=2) + "\n")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _vector_flags() -> list[str]:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return sorted({f for f in flags.split() if f in {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma"}})


if __name__ == "__main__":
    main()
