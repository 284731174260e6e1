"""Benchmark: the same math training through ART's own client (``art.ServerlessBackend`` against /v1/preview) and as
an environment job, on one ``artsvc serve --local``, one after the other: seconds per step, and where the difference
goes.

Both train SmolLM2-135M-Instruct on the math environment's train split with the same scenarios per step, the same
sampling seeds, group size, groups per step and learning rate. The environment job's rollouts run in its worker
against the policy it trains; the client's run in this process through ``env.rollout`` (the environment's own
rollout code) against ``POST /v1/chat/completions`` (the inference process), and each step is a training job that a
worker claims. Validation runs once, at the end of the environment job, and is not counted: the compared number is
the median wall time between consecutive step ends, the first step left out (it loads the models).

    python bench/art_client.py [--steps 6] [--groups 4] [--group-size 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine  # noqa: E402
from service_overhead import free_port, intervals, wait_until_serving  # noqa: E402

LEARNING_RATE = 1e-4


def serve(data_dir: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "ARTSVC_DATA_DIR": str(data_dir), "ARTSVC_LOCAL_MODE": "true"}
    env.pop("ARTSVC_DATABASE_URL", None)
    subprocess.run([sys.executable, "-m", "service", "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "service", "serve", "--local", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(data_dir / "serve.log", "w"))  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_until_serving(base)
    return server, base


def run_environment_job(base: str, data_dir: Path, args: argparse.Namespace) -> dict:
    spec = {"environment": "math", "seed": args.seed,
            "training": {"max_steps": args.steps, "groups_per_step": args.groups, "group_size": args.group_size,
                         "learning_rate": LEARNING_RATE},
            "validation": {"every_n_steps": 10_000, "max_examples": 8, "patience": 1000}}  # fmt: skip
    job = httpx.post(f"{base}/v1/jobs", json=spec, timeout=10).raise_for_status().json()
    while job["status"] in ("queued", "running"):
        time.sleep(1)
        job = httpx.get(f"{base}/v1/jobs/{job['id']}", timeout=10).raise_for_status().json()
    if job["status"] != "succeeded":
        sys.exit(f"the environment job ended {job['status']}: {job['error']}")
    with sqlite3.connect(data_dir / "artsvc.db") as db:
        rows = db.execute("select created_at, metrics, completion_length from training_steps where job_id = ? "
                          "order by step", (job["id"],)).fetchall()  # fmt: skip
    ends = [datetime.fromisoformat(created).timestamp() for created, _, _ in rows]
    metrics = [json.loads(m) for _, m, _ in rows]
    return {"step_ends_s": [e - ends[0] for e in ends], "rollout_s": [m.get("rollout_s") for m in metrics],
            "train_s": [m.get("train_s") for m in metrics], "reply_chars": [chars for _, _, chars in rows]}  # fmt: skip


async def run_client(base: str, data_dir: Path, args: argparse.Namespace) -> dict:
    import art

    import environments
    from environments.base import Sampling
    from service.runner.seeding import batch_for_step, derive_seed

    env = environments.load("math", {})
    backend = art.ServerlessBackend(base_url=f"{base}/v1", api_key="local")
    model = art.TrainableModel(name="math-client", project="bench", base_model="SmolLM2-135M-Instruct")
    await model.register(backend)
    ends, rollout_s, train_s = [], [], []
    for step in range(1, args.steps + 1):
        started = time.monotonic()
        scenarios = batch_for_step(env.scenarios("train"), seed=args.seed, step=step, size=args.groups)
        def sampling(scenario: dict, i: int) -> Sampling:  # the environment job's seeds
            return Sampling(temperature=1.0, seed=derive_seed(args.seed, "train", step, scenario["id"], i))

        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(env.rollout(model, s, sampling(s, i)) for i in range(args.group_size)) for s in scenarios),
            pbar_desc=None,
        )
        rolled = time.monotonic()
        await backend.train(model, groups, learning_rate=LEARNING_RATE)
        ends.append(time.time())
        rollout_s.append(rolled - started)
        train_s.append(time.monotonic() - rolled)
    await backend.close()
    with sqlite3.connect(data_dir / "artsvc.db") as db:
        jobs = db.execute("select id, created_at, started_at, finished_at from jobs where kind = 'client_batch' "
                          "order by created_at").fetchall()  # fmt: skip
        series = "select job_id from client_models"
        steps = db.execute(f"select metrics, completion_length from training_steps where job_id = ({series}) "
                           "order by step").fetchall()  # fmt: skip
    worker_train = [json.loads(m).get("train_s") for m, _ in steps]
    queued_s = [_seconds(started) - _seconds(created) for _, created, started, _ in jobs]
    worked_s = [_seconds(finished) - _seconds(started) for _, _, started, finished in jobs]
    return {"step_ends_s": [e - ends[0] for e in ends], "rollout_s": rollout_s, "train_call_s": train_s,
            "queued_s": queued_s, "batch_job_s": worked_s, "worker_train_s": worker_train,
            "reply_chars": [chars for _, chars in steps]}  # fmt: skip


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _median(values: list) -> float:
    return round(statistics.median(v for v in values[1:] if v is not None), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="a data directory's cache/ to copy (skips converting the GGUF file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-art-client-") as tmp:
        data_dir = Path(tmp)
        if args.cache is not None:
            shutil.copytree(args.cache, data_dir / "cache")
        server, base = serve(data_dir)
        try:
            environment = run_environment_job(base, data_dir, args)
            client = asyncio.run(run_client(base, data_dir, args))
        finally:
            server.terminate()
            server.wait(timeout=60)
    env_step, client_step = _median(intervals(environment["step_ends_s"])), _median(intervals(client["step_ends_s"]))
    result = {
        "machine": machine(), "steps": args.steps, "groups": args.groups, "group_size": args.group_size,
        "environment_median_step_s": env_step, "client_median_step_s": client_step,
        "ratio": round(client_step / env_step, 3),
        # what the client's training path adds to the batch's own training: HTTP, serialisation, queue, events
        "client_train_path_s": _median([call - worker for call, worker in zip(client["train_call_s"],
                                                                              client["worker_train_s"])]),
        "environment": {"rollout_s": _median(environment["rollout_s"]), "train_s": _median(environment["train_s"]),
                        "reply_chars": _median(environment["reply_chars"])},
        "client": {"rollout_s": _median(client["rollout_s"]), "reply_chars": _median(client["reply_chars"]),
                   "train_call_s": _median(client["train_call_s"]),
                   "queued_s": _median(client["queued_s"]), "batch_job_s": _median(client["batch_job_s"]),
                   "worker_train_s": _median(client["worker_train_s"])},
        "raw": {"environment": environment, "client": client},
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "art_client.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))


if __name__ == "__main__":
    main()
