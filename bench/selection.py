"""Benchmark: learning against selection on the README's main job, measured with the evaluation jobs.

Trains ``artsvc train --env math`` in a fresh data directory, then evaluates the warm start (step 0) and the
job's best checkpoint on the 200 validation problems, once with one sample per problem and once best-of-8, and
runs the promotion gate: best checkpoint against warm start (learning), and best-of-8 against one sample
(rejected: not comparable, selection is not learning). It also checks that an n=1 evaluation of the best
checkpoint reproduces the job's own validation point example by example.

    python bench/selection.py [--seed 0] [extra artsvc train flags...]
    python bench/selection.py --data-dir DIR --job JOB_ID    # evaluate a job trained before (no training)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

from sqlmodel import Session  # noqa: E402

from env_rl import RESULTS, machine  # noqa: E402
from service.evaluation.compare import Measured, compare  # noqa: E402
from service.evaluation.runner import run_evaluation  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.spec import EvaluationSpec  # noqa: E402
from service.store import db as store_db  # noqa: E402
from service.store import runs  # noqa: E402

N = 8


def evaluate(engine, settings: Settings, job: dict[str, Any], step: int, n: int) -> dict[str, Any]:
    examples = job["spec"]["validation"]["max_examples"]  # the job's own validation examples
    ks = sorted(k for k in {1, 2, 4, n} if k <= n)
    spec = EvaluationSpec.model_validate({"model": {"job_id": job["id"], "step": step}, "n": n, "ks": ks, "max_examples": examples})
    with Session(engine) as session:
        evaluation = runs.create_evaluation(session, spec=spec, environment="math")
        session.commit()
        evaluation_id = evaluation.id
    started = time.monotonic()
    done = asyncio.run(run_evaluation(evaluation_id, db=engine, data_dir=settings.data_dir, settings=settings))
    return {"id": done.id, "step": step, "n": n, "summary": done.summary, "wall_time_s": round(time.monotonic() - started, 1)}


def measured(engine, job_id: str, step: int) -> Measured:
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
        return Measured(job.id, job.kind, step, job.manifest, runs.example_results(session, job_id=job_id, step=step))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, help="The data directory of a job trained before (with --job).")
    parser.add_argument("--job", help="Its id: evaluate it instead of training a new one.")
    args, extra = parser.parse_known_args()
    command = [sys.executable, "-m", "service", "train", "--env", "math", "--seed", str(args.seed), "--json", *extra]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="artsvc-bench-"))  # kept: rerun with --data-dir --job
    settings = Settings(_env_file=None, data_dir=data_dir, database_url=f"sqlite:///{data_dir}/artsvc.db")
    train_s = None
    if args.job is None:
        env = {k: v for k, v in os.environ.items() if k != "ARTSVC_DATABASE_URL"} | {"ARTSVC_DATA_DIR": str(data_dir)}
        started = time.monotonic()
        completed = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        if completed.returncode != 0:
            sys.exit(f"training failed ({completed.returncode}); its error is above")
        train_s = round(time.monotonic() - started, 1)
        print(f"trained in {data_dir}: rerun the evaluations with --data-dir {data_dir} --job ...", file=sys.stderr)
    engine = store_db.make_engine(settings.resolved_database_url)
    with Session(engine) as session:
        row = runs.get_job(session, job_id=args.job or json.loads(completed.stdout.strip().splitlines()[-1])["id"])
        job = {"id": row.id, "spec": row.spec, "best_step": row.best_step, "step": row.step, "stop_reason": row.stop_reason}
    best = job["best_step"]
    evaluations = {f"step{step}_n{n}": evaluate(engine, settings, job, step, n) for step in (0, best) for n in (1, N)}
    side = {name: measured(engine, e["id"], 0) for name, e in evaluations.items()}
    job_at_best = measured(engine, job["id"], best)
    same = sum(a.outcome == b.outcome and a.completion == b.completion
               for a, b in zip(job_at_best.results, side[f"step{best}_n1"].results))  # fmt: skip
    verdicts = {
        "learning: best vs warm start (n=1, min_delta 0.02)": compare(side["step0_n1"], side[f"step{best}_n1"], min_delta=0.02),
        "best checkpoint evaluated vs the job's own validation": compare(job_at_best, side[f"step{best}_n1"]),
        f"selection: warm start best-of-{N} vs n=1": compare(side["step0_n1"], side[f"step0_n{N}"]),
    }
    result = {"machine": machine(), "command": " ".join(command[2:]), "train_wall_time_s": train_s, "job": job,
              "evaluations": evaluations, "reproduced_examples": same, "examples": len(job_at_best.results),
              "verdicts": verdicts}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "selection.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['command']} (trained in {train_s} s); {machine()}\n")
    print(f"| checkpoint | samples | pass@1 | pass@{N} | best-of-N pass rate (selection) | eval wall time |")
    print("| --- | --- | --- | --- | --- | --- |")
    for e in evaluations.values():
        s = e["summary"]
        at_n = s["pass_at_k"].get(str(N))
        print(f"| step {e['step']} | {e['n']} | {s['pass_at_k']['1']:.3f} | {'–' if at_n is None else f'{at_n:.3f}'} "
              f"| {s['pass_rate']:.3f} | {e['wall_time_s']:.1f} s |")  # fmt: skip
    print(f"\nn=1 evaluation of step {best} reproduces the job's validation on {same} of {result['examples']} examples\n")
    for name, v in verdicts.items():
        overall = v["overall"]
        detail = (f"delta {overall['delta']:+.3f}, 95% interval [{overall['ci_low']:+.3f}, {overall['ci_high']:+.3f}]"
                  if overall else "; ".join(v["reasons"]))  # fmt: skip
        print(f"- {name}: **{v['decision']}** ({detail})")


if __name__ == "__main__":
    main()
