"""Benchmark: what judging one training step costs with RULER (one call per group, the trajectories
ranked together) against per-trajectory judging (one call per trajectory, each scored alone), on the
same groups, through the same code (judges.ruler.RulerJudge, litellm, a judge on loopback).

The groups are email-agent episodes: for each of ``--groups`` training questions, ``--group-size``
runs of the scripted demonstrator (imperfect on purpose, so a group holds good and bad episodes).
The judge is tests/judges/judge_server.py, an OpenAI-compatible server on loopback that counts tokens
with litellm's tokenizer for the model and answers at once: calls and tokens are exact, and cost is
litellm's offline price for ``--model``. Wall time here is client-side overhead only (HTTP, litellm,
prompt building), since the loopback judge thinks for no time; with a real judge, time per call adds
to it. Writes bench/results/judge_calls.json and prints a Markdown table for README's Results.

    python bench/judge_calls.py [--groups 8] [--group-size 8] [--repeats 5] [--model openai/gpt-4o-mini]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import art  # noqa: E402

import environments  # noqa: E402
from env_rl import RESULTS, machine  # noqa: E402
from environments.email.agents import demonstrator, play  # noqa: E402
from judges.ruler import JudgeConfig, RulerJudge  # noqa: E402
from judges.usage import JudgeUsage  # noqa: E402
from tests.judges.judge_server import judge_server  # noqa: E402


def email_groups(groups: int, size: int) -> list[art.TrajectoryGroup]:
    env = environments.load("email")
    scenarios = env.scenarios("train")[:groups]
    return [
        art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=played.messages, tools=list(env.tools), reward=played.result.reward)
            for played in (play(scenario, demonstrator, max_turns=env.max_turns, seed=seed) for seed in range(size))
        )
        for scenario in scenarios
    ]


async def judge_step(judge: RulerJudge, units: list[art.TrajectoryGroup]) -> tuple[float, JudgeUsage, int]:
    """Judge every unit concurrently (within the judge's own limit): wall seconds, usage, calls."""
    started = time.perf_counter()
    results = await asyncio.gather(*(judge.judge(unit) for unit in units))
    usage = JudgeUsage()
    for result in results:
        assert result.failure is None, result.failure
        usage.add(result.usage)
    return time.perf_counter() - started, usage, sum(r.attempts for r in results)


async def measure(modes: dict[str, list[art.TrajectoryGroup]], model: str, api_base: str, repeats: int) -> dict:
    judge = RulerJudge(JudgeConfig(model=model, api_base=api_base, api_key="bench"))
    await judge_step(judge, next(iter(modes.values()))[:1])  # warm litellm's imports and connection pool
    rows = {}
    for name, units in modes.items():
        runs = [await judge_step(judge, units) for _ in range(repeats)]
        wall, usage, calls = statistics.median(r[0] for r in runs), runs[0][1], runs[0][2]
        rows[name] = {"calls": calls, "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                      "cost_usd": usage.cost_usd, "median_wall_s": wall}  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    args = parser.parse_args()
    groups = email_groups(args.groups, args.group_size)
    modes = {
        "ruler (one call per group)": groups,
        "per trajectory (one call each)": [art.TrajectoryGroup([t]) for g in groups for t in g.trajectories],
    }
    with judge_server() as server:
        rows = asyncio.run(measure(modes, args.model, server.api_base, args.repeats))
    ruler, single = rows.values()
    ratios = {key: single[key] / ruler[key] for key in ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "median_wall_s")}
    result = {"machine": machine(), "model": args.model, "groups": args.groups, "group_size": args.group_size,
              "repeats": args.repeats, "per_step": rows, "per_trajectory_over_ruler": ratios}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "judge_calls.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"| judging of one step ({args.groups} groups x {args.group_size}) | calls | prompt tokens | completion tokens "
          f"| cost ({args.model}) | wall time, loopback judge (median of {args.repeats}) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in [*rows.items(), ("per trajectory / ruler", ratios)]:
        print(f"| {name} | {r['calls']:.4g} | {r['prompt_tokens']:.4g} | {r['completion_tokens']:.4g} "
              f"| {r['cost_usd']:.4g} | {r['median_wall_s']:.3g} |")  # fmt: skip
    print(f"\n{machine()}")


if __name__ == "__main__":
    main()
