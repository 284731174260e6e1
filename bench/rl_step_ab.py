"""One GRPO training step on an agent's rows, by two checkouts of this service in one run: what a change to the step
(its passes, what it measures) costs on the real model, with nothing else of a job around it.

    python bench/rl_step_ab.py --before /path/to/old/checkout [--after .] [--env email] [--episodes 8] [--rounds 2]

Each checkout runs in its own child process (its own code, this venv): SmolLM2-135M-Instruct through the transformers
backend's ``PolicyEngine``, the environment's first ``--episodes`` teacher episodes as RL rows (one a packed row, as a
group's episodes are packed), and ``training.grpo_step`` at learning rate 0 (policy forward and backward, reference
pass, optimizer step; the activations the engine's budget keeps, where the checkout has one), once untimed and then
``--steps`` times. Rounds alternate before/after; writes
``bench/results/rl_step_ab[_LABEL].json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import checkout_ab  # noqa: E402


def steps(env_name: str, episodes: int, timed: int, data: Path) -> dict:
    """In a child that imports one checkout's code: the step, timed."""
    from art import dev

    from environments import load
    from service.backends.transformers import training
    from service.backends.transformers.engine import PolicyEngine
    from service.backends.transformers.models import resolve_base_model

    engine = PolicyEngine(data / "model", resolve_base_model("SmolLM2-135M-Instruct", data / "cache"))
    rows = training.sft_rows(engine.tokenizer, list(load(env_name, {}).demonstrations(seed=0, count=episodes)))
    packed = training.pack(rows, seq_len=0)
    kept = {"kept": engine.kept} if hasattr(engine, "kept") else {}  # its activations budget, where a checkout has one
    step = {"learning_rate": 0.0, "config": dev.TrainConfig(), "max_grad_norm": 1.0, **kept}
    training.grpo_step(engine.model, engine.optimizer, packed, **step)  # untimed: the first pass's allocations
    seconds = []
    for _ in range(timed):
        started = time.perf_counter()
        metrics = training.grpo_step(engine.model, engine.optimizer, packed, **step)
        seconds.append(time.perf_counter() - started)
    return {"seconds": seconds, "rows": int(packed["tokens"].shape[0]), "row_length": int(packed["tokens"].shape[1]),
            "precision": str(engine.dtype), "metrics": metrics,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # fmt: skip


def main() -> None:
    if (child := checkout_ab.child_arguments()) is not None:  # the checkout's code first on the path, then its steps
        env_name, episodes, timed, data = child[:4]
        checkout_ab.write_result(child, steps(env_name, int(episodes), int(timed), Path(data)))
        return
    from env_rl import machine  # the CPU model and its vector units (here, not in a child: it imports this tree's code)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--env", default="email")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="timed steps a child, after an untimed one")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, default=ROOT / ".artsvc", help="where the converted base model is cached")
    parser.add_argument("--label", default="")
    args = parser.parse_args()

    def side(checkout: Path, data: Path) -> dict:
        return checkout_ab.run_child(__file__, checkout, args.env, str(args.episodes), str(args.steps), str(data))

    def report(name: str, result: dict) -> None:
        print(f"{name}: {[round(s, 2) for s in result['seconds']]} s a step, peak RSS {result['peak_rss_gib']:.2f} GiB",
              flush=True)  # fmt: skip

    rounds = checkout_ab.alternate(args.before, args.after, args.rounds, args.data / "cache", side, report)
    summary = {side: {"median_step_s": statistics.median(s for r in results for s in r["seconds"])}
               for side, results in rounds.items()}  # fmt: skip
    summary["after_over_before"] = summary["after"]["median_step_s"] / summary["before"]["median_step_s"]
    print(json.dumps(summary, indent=2))
    out = ROOT / "bench" / "results" / f"rl_step_ab{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"machine": machine(), "env": args.env, "episodes": args.episodes,
                               "summary": summary, "rounds": rounds}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
