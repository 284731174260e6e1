"""Benchmark: a hybrid email job judged offline by a base model this service serves (issue 32 item 4).

Starts ``artsvc serve --local`` as the judge's endpoint (ARTSVC_SERVED_BASE_MODELS, the inference process), then
runs ``artsvc train --env email`` with ``reward.mode: hybrid`` against it: RULER rewards from the served model
for training (exact verdicts: ARTSVC_JUDGE_EXACT_VERDICTS), the verifier's accuracy for stopping. Reports per step
the RULER reward, the judge's groups, drops, calls and seconds and its agreement with the verifier (Spearman within
each group), each validation point, and the alerts that fired; writes ``bench/results/email_hybrid_<label>.json``.

    python bench/local_judge.py [--judge SmolLM2-135M-Instruct] [--label smollm2] [artsvc train flags]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from service.api_client import ApiClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_rl import RESULTS, train_and_read  # noqa: E402

# The judge's calls are long prompts (a group of email episodes) sampled beside the training: bounds to fit them.
SERVER_ENV = {"ARTSVC_INFERENCE_MAX_TOKENS": "2048", "ARTSVC_INFERENCE_DEADLINE_S": "600",
              "ARTSVC_INFERENCE_MAX_COMPLETION_TOKENS": "2048", "ARTSVC_WORKER_CPU_POLICY": "nice"}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", default="SmolLM2-135M-Instruct", help="the base model served as the judge")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="smollm2")
    args, extra = parser.parse_known_args()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="artsvc-judge-") as serving_dir:
        server_env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
        server_env.update(SERVER_ENV, ARTSVC_DATA_DIR=serving_dir, ARTSVC_SERVED_BASE_MODELS=f"judge={args.judge}")
        cli = [sys.executable, "-m", "service"]
        subprocess.run([*cli, "db", "upgrade"], env=server_env, check=True, capture_output=True)
        server = subprocess.Popen([*cli, "serve", "--local", "--port", str(port)], env=server_env,
                                  stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            ApiClient(base_url=f"http://127.0.0.1:{port}", token=None).wait_until_healthy()
            os.environ.update(ARTSVC_JUDGE_MODELS="openai/judge", ARTSVC_JUDGE_API_BASE=f"http://127.0.0.1:{port}/v1",
                              ARTSVC_JUDGE_API_KEY="local", ARTSVC_JUDGE_EXACT_VERDICTS="true",
                              ARTSVC_JUDGE_TIMEOUT_S="900", ARTSVC_JUDGE_MAX_RETRIES="1")  # fmt: skip
            spec = Path(serving_dir) / "spec.json"
            spec.write_text(json.dumps({"environment": "email",
                                        "reward": {"mode": "hybrid", "judge_model": "openai/judge"}}))  # fmt: skip
            result = train_and_read("email", args.seed, ["--spec", str(spec), *extra])
        finally:
            server.terminate()
            server.wait(timeout=60)
    result["judge"] = args.judge
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"email_hybrid_{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    _report(result)


def _report(result: dict) -> None:
    print(f"{result['command']}\n{result['machine']}\njudge: {result['judge']}, wall {result['wall_time_s'] / 60:.1f} min\n")
    print("| step | RULER reward | groups judged (dropped) | calls | judge s | agreement with the verifier |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in result["steps"]:
        agreement = s.get("judge_agreement")
        print(f"| {s['step']} | {s['reward_mean']:.3f} | {s.get('judge_groups', 0):.0f} ({s.get('judge_dropped_groups', 0):.0f}) "
              f"| {s.get('judge_attempts', 0):.0f} | {s.get('judge_s', 0):.1f} | {'-' if agreement is None else f'{agreement:.2f}'} |")
    print("\n| step | val acc | greedy | outcomes |\n| --- | --- | --- | --- |")
    for p in result["validation"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in p["outcomes"].items())
        print(f"| {p['step']} | {p['accuracy']:.3f} | {p['greedy_accuracy']:.3f} | {outcomes} |")
    print("\nalerts:", ", ".join(f"{a['kind']} at step {a['step']}" for a in result["alerts"]) or "none")


if __name__ == "__main__":
    main()
