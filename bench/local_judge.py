"""Benchmark: RULER judged offline by a base model this service serves (issue 32 item 4).

Starts ``artsvc serve --local`` as the judge's endpoint (ARTSVC_SERVED_BASE_MODELS, the inference process), with
RULER asking for the exact verdict schema (ARTSVC_JUDGE_EXACT_VERDICTS). Two measurements:

- ``job`` (default): ``artsvc train --env email`` with ``reward.mode: hybrid`` against it: RULER rewards from the
  served model for training, the verifier's accuracy for stopping. Reports per step the RULER reward, the judge's
  groups, drops, calls and seconds and its agreement with the verifier (Spearman within each group), each
  validation point and the alerts that fired; writes ``bench/results/email_hybrid_<label>.json``.
- ``scripted``: the judge alone on groups of email episodes, half by the teacher and half by random tool calls,
  each judged once: the verifier's rewards beside the judge's scores, their Spearman correlation and the seconds per
  call; writes ``bench/results/local_judge_agreement_<label>.json``.

    python bench/local_judge.py [job|scripted] [--judge SmolLM2-135M-Instruct] [--label smollm2] [train flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

from env_rl import RESULTS, machine, train_and_read  # noqa: E402

import art  # noqa: E402

import environments  # noqa: E402
from environments.email.agents import demonstrator, play, random_agent  # noqa: E402
from judges.ruler import JudgeConfig, RulerJudge  # noqa: E402
from service.api_client import ApiClient  # noqa: E402
from service.training.judging import rank_agreement  # noqa: E402

JUDGE = "openai/judge"  # the served model's name, as litellm names an OpenAI-compatible endpoint's model
# The judge's calls are long prompts (a group of email episodes) sampled beside the training: bounds to fit them.
SERVER_ENV = {"ARTSVC_INFERENCE_MAX_TOKENS": "2048", "ARTSVC_INFERENCE_DEADLINE_S": "600",
              "ARTSVC_INFERENCE_MAX_COMPLETION_TOKENS": "2048", "ARTSVC_WORKER_CPU_POLICY": "nice"}  # fmt: skip


@contextmanager
def serving(judge: str) -> Iterator[str]:
    """``artsvc serve --local`` serving ``judge`` as ``judge`` in a data directory of its own; its /v1 URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="artsvc-judge-") as serving_dir:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
        env.update(SERVER_ENV, ARTSVC_DATA_DIR=serving_dir, ARTSVC_SERVED_BASE_MODELS=f"judge={judge}")
        cli = [sys.executable, "-m", "service"]
        subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True)
        server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
        try:
            ApiClient(base_url=f"http://127.0.0.1:{port}", token=None).wait_until_healthy()
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            server.terminate()
            server.wait(timeout=60)


def job(api_base: str, seed: int, extra: list[str]) -> dict:
    os.environ.update(ARTSVC_JUDGE_MODELS=JUDGE, ARTSVC_JUDGE_API_BASE=api_base, ARTSVC_JUDGE_API_KEY="local",
                      ARTSVC_JUDGE_EXACT_VERDICTS="true", ARTSVC_JUDGE_TIMEOUT_S="900",
                      ARTSVC_JUDGE_MAX_RETRIES="1")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.json"
        spec.write_text(json.dumps({"environment": "email", "reward": {"mode": "hybrid", "judge_model": JUDGE}}))
        return train_and_read("email", seed, ["--spec", str(spec), *extra])


def mixed_groups(groups: int, size: int) -> list[art.TrajectoryGroup]:
    """For each of the first ``groups`` training questions, half the episodes by the teacher (right, almost always)
    and half by random tool calls (never right), in an order drawn per question: groups a judge can rank."""
    env = environments.load("email")
    built = []
    for index, scenario in enumerate(env.scenarios("train")[:groups]):
        teacher = set(random.Random(index).sample(range(size), size // 2))
        played = [play(scenario, demonstrator if i in teacher else random_agent, max_turns=env.max_turns, seed=i)
                  for i in range(size)]  # fmt: skip
        trajectories = [art.Trajectory(messages_and_choices=p.messages, tools=list(env.tools), reward=p.result.reward)
                        for p in played]  # fmt: skip
        built.append(art.TrajectoryGroup(trajectories))
    return built


def scripted(api_base: str, groups: int, group_size: int) -> dict:
    judge = RulerJudge(JudgeConfig(model=JUDGE, api_base=api_base, api_key="local", timeout_s=900, max_retries=0,
                                   exact_verdicts=True))  # fmt: skip

    async def judged() -> list[dict]:
        rows = []
        for group in mixed_groups(groups, group_size):
            started = time.perf_counter()
            result = await judge.judge(group)
            seconds = time.perf_counter() - started
            scored = result.group
            row = {"verifier": [t.reward for t in group.trajectories], "seconds": round(seconds, 1),
                   "failure": result.failure, "ruler": None, "agreement": None, "explanations": None}  # fmt: skip
            if scored is not None:
                row.update(ruler=[t.reward for t in scored.trajectories], agreement=rank_agreement(scored),
                           explanations=[t.logs[-1] for t in scored.trajectories])  # fmt: skip
            rows.append(row)
        return rows

    return {"groups": asyncio.run(judged())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("job", "scripted"), default="job")
    parser.add_argument("--judge", default="SmolLM2-135M-Instruct", help="the base model served as the judge")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="smollm2")
    parser.add_argument("--groups", type=int, default=8, help="scripted: groups of the teacher's episodes")
    parser.add_argument("--group-size", type=int, default=4, help="scripted: episodes a group")
    args, extra = parser.parse_known_args()
    with serving(args.judge) as api_base:
        if args.what == "job":
            result = job(api_base, args.seed, extra)
        else:
            result = {"machine": machine(), **scripted(api_base, args.groups, args.group_size)}
    result["judge"] = args.judge
    RESULTS.mkdir(exist_ok=True)
    name = f"email_hybrid_{args.label}" if args.what == "job" else f"local_judge_agreement_{args.label}"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (_report_job if args.what == "job" else _report_scripted)(result)


def _report_job(result: dict) -> None:
    wall = result["wall_time_s"] / 60
    print(f"{result['command']}\n{result['machine']}\njudge: {result['judge']}, wall {wall:.1f} min\n")
    print("| step | RULER reward | groups judged (dropped) | calls | judge s | agreement with the verifier |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in result["steps"]:
        agreement = "-" if s.get("judge_agreement") is None else f"{s['judge_agreement']:.2f}"
        judged = f"{s.get('judge_groups', 0):.0f} ({s.get('judge_dropped_groups', 0):.0f})"
        print(f"| {s['step']} | {s['reward_mean']:.3f} | {judged} | {s.get('judge_attempts', 0):.0f} "
              f"| {s.get('judge_s', 0):.1f} | {agreement} |")
    print("\n| step | val acc | greedy | outcomes |\n| --- | --- | --- | --- |")
    for p in result["validation"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in p["outcomes"].items())
        print(f"| {p['step']} | {p['accuracy']:.3f} | {p['greedy_accuracy']:.3f} | {outcomes} |")
    print("\nalerts:", ", ".join(f"{a['kind']} at step {a['step']}" for a in result["alerts"]) or "none")


def _report_scripted(result: dict) -> None:
    print(f"{result['machine']}\njudge: {result['judge']}\n")
    print("| group | verifier rewards | judge's scores | Spearman | seconds |\n| --- | --- | --- | --- | --- |")
    for i, g in enumerate(result["groups"]):
        scores = g["failure"] if g["ruler"] is None else ", ".join(f"{s:.2f}" for s in g["ruler"])
        agreement = "-" if g["agreement"] is None else f"{g['agreement']:.2f}"
        print(f"| {i} | {', '.join(f'{r:.2f}' for r in g['verifier'])} | {scores} | {agreement} | {g['seconds']} |")
    agreements = [g["agreement"] for g in result["groups"] if g["agreement"] is not None]
    if agreements:
        print(f"\nmean Spearman {statistics.mean(agreements):.2f} over {len(agreements)} groups with spread in both")


if __name__ == "__main__":
    main()
