"""Benchmark: one warm-start step of the email agent (``training.sft_step`` over two of the teacher's demonstrations,
the warm start's batch) on SmolLM2-135M-Instruct in the backend's precision, with its two switches:

- activations: every pass recomputes its layers in the backward (gradient checkpointing, ``recomputed``), or a pass
  keeps as many layers' activations as the engine's budget holds (``kept``, the warm start now: activation_memory.py);
- memory: glibc's own thresholds (``glibc``), or freed blocks up to 256 MiB kept for the next tensors and the heap's
  free top handed back only past 512 MiB (``kept_blocks``, ``mallopt``). glibc unmaps a block past its adaptive
  threshold (at most 32 MiB) when it is freed, so a pass faults its large activations in again, page by page. Tried
  for the service and not shipped: 5x fewer faults, but no faster step with checkpointing (README Results).

Each side runs in a process of its own (the allocator's settings are the process's), ``--steps`` steps after an untimed
one; the sides run in turn, ``--rounds`` times, and only sides of the same round are compared: the report gives each
side's median step seconds, its median ratio to ``recomputed+glibc`` (what the warm start did before), its minor page
faults a step and the process's peak RSS.

    python bench/warm_start_step.py [--rounds 2] [--steps 3]

Writes ``bench/results/warm_start_step.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

SIDES = ("recomputed+glibc", "recomputed+kept_blocks", "kept+glibc", "kept+kept_blocks")
BASELINE = SIDES[0]


def keep_freed_blocks() -> bool:
    """mallopt's M_MMAP_THRESHOLD (-3) to 256 MiB and M_TRIM_THRESHOLD (-1) to 512 MiB; True where glibc took both."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and bool(mallopt(-3, 256 * 2**20)) and bool(mallopt(-1, 512 * 2**20))


def child(side: str, steps: int) -> dict:
    """One side's steps in this process: seconds of each, minor page faults a step, peak RSS in GiB."""
    import resource
    import time

    activations, memory = side.split("+")
    if memory == "kept_blocks" and not keep_freed_blocks():
        raise SystemExit("glibc's mallopt is not here: the kept_blocks sides cannot run")

    from environments.email.env import EmailEnvironment
    from service.backends.transformers import training
    from service.backends.transformers.engine import PolicyEngine
    from service.backends.transformers.models import resolve_base_model

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(os.environ.get("ARTSVC_BENCH_CACHE", Path(tmp) / "cache"))
        engine = PolicyEngine(Path(tmp) / "model", resolve_base_model("SmolLM2-135M-Instruct", cache))
        rows = training.sft_rows(engine.tokenizer, list(EmailEnvironment().demonstrations(seed=0, count=2)))
        if activations == "recomputed":
            engine.kept.budget = 0

        def step() -> float:
            started = time.perf_counter()
            training.sft_step(engine.model, engine.optimizer, rows, learning_rate=0.0, max_grad_norm=1.0,
                              kept=engine.kept)  # fmt: skip
            return time.perf_counter() - started

        step()  # untimed
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = [step() for _ in range(steps)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return {"seconds": seconds, "median_s": statistics.median(seconds), "faults_per_step": faults / steps,
                "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "positions": sum(len(r.token_ids) for r in rows), "precision": str(engine.dtype)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    from roofline import cpu

    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    rounds = []
    with tempfile.TemporaryDirectory() as cache:  # the model converted once, read by every side
        env["ARTSVC_BENCH_CACHE"] = cache
        for round_ in range(args.rounds):
            results = {}
            for side in SIDES:
                out = subprocess.run([sys.executable, __file__, "--child", side, "--steps", str(args.steps)], env=env,
                                     check=True, capture_output=True, text=True).stdout  # fmt: skip
                results[side] = json.loads(out.strip().splitlines()[-1])
                got = results[side]
                print(f"round {round_} {side:24s} {got['median_s']:6.2f} s a step, "
                      f"{got['faults_per_step']:9.0f} faults a step, peak {got['peak_rss_gib']:.2f} GiB")
            rounds.append(results)
    summary = {side: {"median_s": statistics.median(r[side]["median_s"] for r in rounds),
                      "ratio_to_before": statistics.median(r[side]["median_s"] / r[BASELINE]["median_s"]
                                                           for r in rounds),
                      "faults_per_step": statistics.median(r[side]["faults_per_step"] for r in rounds),
                      "peak_rss_gib": max(r[side]["peak_rss_gib"] for r in rounds)} for side in SIDES}  # fmt: skip
    result = {"machine": cpu(), "rounds": rounds, "summary": summary}
    print(json.dumps(summary, indent=1))
    (ROOT / "bench" / "results" / "warm_start_step.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
