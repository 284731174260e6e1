"""One validation sweep of an agent environment (email by default, or 2048) on the base model, by two checkouts of this
service in one run: what the sampler's changes do to a multi-turn validation, on the real model, with nothing else of
a job around it.

    python bench/agent_validation_ab.py --before /path/to/old/checkout [--after .] [--examples 16] [--rounds 1]
        [--env 2048 --env-arg target_tile=16 --env-arg max_turns=12] [--adapter DIR] [--no-greedy]

Each checkout runs in its own child process (its own code, this venv): SmolLM2-135M-Instruct through the transformers
backend, served as a job serves it, and ``service.training.validation.validate`` on the environment's first
``--examples`` validation scenarios (each sampled at temperature 1 and greedily; email: up to 6 turns of 96 tokens).
``--adapter`` loads a LoRA adapter into the policy first, on both sides: a job's warm-started one (its
``models/artsvc/models/<name>/reference`` folder) plays an agent's validation as a job does, where the base model's
games end within a turn or three. ``--no-greedy`` plays each scenario once, sampled, as ``"greedy": false`` jobs do.
Rounds alternate before/after; each reports wall seconds, CPU seconds (CPU%), the tokens generated, the outcomes, and
how many sampled episodes the two sides played identically. Writes ``bench/results/agent_validation_ab[_LABEL].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import checkout_ab  # noqa: E402


async def sweep(examples: int, data: Path, env_name: str, env_args: dict, adapter: str, greedy: bool) -> dict:
    """In a child that imports one checkout's code: the sweep, timed."""
    import art
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    import environments
    from service.backends import make_backend
    from service.evaluation.results import completion_tokens
    from service.training.validation import validate

    env = environments.load(env_name, env_args)
    backend = make_backend("transformers", data_dir=data, seed=0)
    model = art.TrainableModel(name="ab", project="ab", base_model="SmolLM2-135M-Instruct", base_path=str(data / "art"))
    await model.register(backend)
    if adapter:
        set_peft_model_state_dict(backend._engines[model.name].model, load_peft_weights(adapter, device="cpu"))
    rows = list(env.scenarios("val"))[:examples]
    cpu, wall = time.process_time(), time.perf_counter()
    values, sampled = await validate(env, model, rows, seed=0, temperature=1.0, greedy=greedy)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await backend.close()
    return {"wall_s": wall, "cpu_s": cpu, "accuracy": values.accuracy, "greedy_accuracy": values.greedy_accuracy,
            "outcomes": values.outcomes, "tokens": values.tokens_generated,
            "sampled_replies": [[m.get("content") for m in t.messages() if m.get("role") == "assistant"] for t in sampled],
            "sampled_tokens": [completion_tokens(t) for t in sampled]}  # fmt: skip


def main() -> None:
    if (child := checkout_ab.child_arguments()) is not None:  # the checkout's code first on the path, then its sweep
        import asyncio

        examples, data, env_name, env_args, adapter, greedy = child[:6]
        result = sweep(int(examples), Path(data), env_name, json.loads(env_args), adapter, greedy == "greedy")
        checkout_ab.write_result(child, asyncio.run(result))
        return
    from env_rl import machine  # the CPU model and its vector units (here, not in a child: it imports this tree's code)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", type=Path, default=ROOT / ".artsvc", help="where the converted base model is cached")
    parser.add_argument("--label", default="")
    parser.add_argument("--env", default="email")
    parser.add_argument("--env-arg", action="append", default=[], help="KEY=VALUE (an integer value as an integer)")
    parser.add_argument("--adapter", type=Path, help="a LoRA adapter folder loaded into the policy on both sides")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    env_args = {key: int(value) if value.lstrip("-").isdigit() else value
                for key, value in (item.split("=", 1) for item in args.env_arg)}  # fmt: skip

    def side(checkout: Path, data: Path) -> dict:
        return checkout_ab.run_child(__file__, checkout, str(args.examples), str(data), args.env, json.dumps(env_args),
                                     str(args.adapter.resolve()) if args.adapter else "",
                                     "greedy" if args.greedy else "sampled")  # fmt: skip

    def report(name: str, result: dict) -> None:
        print(f"{name}: {result['wall_s']:.1f} s, CPU {100 * result['cpu_s'] / result['wall_s']:.0f}%, "
              f"{result['tokens']} tokens, accuracy {result['accuracy']} (greedy {result['greedy_accuracy']}), "
              f"{result['outcomes']}", flush=True)

    rounds = checkout_ab.alternate(args.before, args.after, args.rounds, args.data / "cache", side, report)
    same = sum(a == b for a, b in zip(rounds["before"][0]["sampled_replies"], rounds["after"][0]["sampled_replies"]))
    summary = {side: {"median_wall_s": statistics.median(r["wall_s"] for r in results),
                      "walls_s": [round(r["wall_s"], 1) for r in results]} for side, results in rounds.items()}  # fmt: skip
    summary["speedup"] = summary["before"]["median_wall_s"] / summary["after"]["median_wall_s"]
    summary["sampled_episodes_identical"] = f"{same}/{args.examples}"
    print(json.dumps(summary, indent=2))
    out = ROOT / "bench" / "results" / f"agent_validation_ab{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"machine": machine(), "examples": args.examples,
                               "env": args.env, "env_args": env_args, "greedy": args.greedy,
                               "adapter": str(args.adapter) if args.adapter else None,
                               "summary": summary, "rounds": rounds}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
