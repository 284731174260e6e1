"""Benchmark: ``artsvc train --env NAME`` end to end, for any environment.

Runs the job in a fresh data directory (so the warm start is really trained, not cached),
records wall time, peak memory and CPU use, reads the validation and step series back from the store,
and writes ``bench/results/<env>_rl.json`` plus Markdown rows for README's Results.

It also runs the promotion gate (min_delta 0.02) on the best step against step 0, as README's "+8 with ACCEPT"
reads it; ``--gate FILE`` runs it on a results file written before.

    python bench/env_rl.py --env 2048 [--seed 0] [extra artsvc train flags, e.g. --env-arg target_tile=64]
    python bench/env_rl.py --gate bench/results/twenty48_rl_smollm2_defaults.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from cpu_phases import CpuSampler, job_phases, phase_cpu  # noqa: E402
from service.evaluation.compare import Measured, compare  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GATE_MIN_DELTA = 0.02  # issue 32's


def machine() -> str:
    """Cores, CPU model and widest vector unit (results move with both: speed and, across CPUs, the last bits)."""
    return f"{os.cpu_count()} CPU cores ({platform.machine()}{cpu_model()}), Python {platform.python_version()}, {platform.system()}"


def cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    units = " ".join(name for flag, name in VECTOR_UNITS if flag in flags)
    return "".join(f", {part}" for part in (model, units) if part)


# the units a CPU's float32 and bfloat16 products run on, as /proc/cpuinfo flags them, and as the README names them
VECTOR_UNITS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512F"), ("avx2", "AVX2"))


def train_and_read(env_name: str, seed: int, extra: list[str], *, python: str = sys.executable) -> dict[str, Any]:
    """Run the job (by ``python``, a venv's interpreter) in a fresh data dir; its command, wall time, peak RSS, CPU,
    summary, steps and validation points."""
    with tempfile.TemporaryDirectory(prefix="artsvc-bench-") as data_dir:
        env = {k: v for k, v in os.environ.items() if k != "ARTSVC_DATABASE_URL"}
        env["ARTSVC_DATA_DIR"] = data_dir
        command = [python, "-m", "service", "train", "--env", env_name, "--seed", str(seed), "--json", *extra]
        started = time.monotonic()
        # progress shows on stderr; this checkout's code is what runs
        with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) as job, \
                CpuSampler(job.pid) as sampler:  # fmt: skip
            stdout, _ = job.communicate()
        wall = time.monotonic() - started
        if job.returncode != 0:
            sys.exit(f"training failed ({job.returncode}); its error is above")
        summary = json.loads(stdout.strip().splitlines()[-1])
        stored = read_job(Path(data_dir) / "artsvc.db", summary["id"])
        phases = stored_phases(Path(data_dir) / "artsvc.db", summary["id"])
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "machine": machine(),
        "command": " ".join(command[2:]),
        "seed": seed,
        "wall_time_s": round(wall, 1),
        "peak_rss_gib": round(used.ru_maxrss / 1024**2, 2),
        "cpu_percent": round(100 * (used.ru_utime + used.ru_stime) / wall),  # of one core: 200 is two cores busy
        "cpu_by_phase": phase_cpu(sampler.samples, phases),
        # resident memory every 5 s from the start: when the peak is reached, and whether it is kept or returned
        "rss_gib_every_5s": [round(resident / 2**30, 2) for _, _, resident in sampler.samples[::5]],
        "summary": summary,
        **stored,
    }


def stored_phases(database: Path, job_id: str) -> dict[str, list[tuple[float, float]]]:
    """The job's validations, rollouts and training as the store dates them (cpu_phases.job_phases)."""
    with sqlite3.connect(database) as db:
        points = db.execute("select created_at, wall_time_s from validation_points where job_id = ?", (job_id,))
        steps = db.execute("select created_at, metrics from training_steps where job_id = ?", (job_id,))
        return job_phases(list(points), [(created_at, json.loads(metrics)) for created_at, metrics in steps])


def read_job(database: Path, job_id: str) -> dict[str, Any]:
    """A finished job's validation points, steps, per-example outcomes and manifest, from its SQLite store."""
    with sqlite3.connect(database) as db:
        points = [
            {"step": s, "accuracy": a, "greedy_accuracy": g, "outcomes": json.loads(o), "wall_time_s": w}
            for s, a, g, o, w in db.execute(
                "select step, accuracy, greedy_accuracy, outcomes, wall_time_s from validation_points where job_id = ? "
                "order by step",
                (job_id,),
            )
        ]
        examples = [
            {"step": st, "scenario_id": sid, "outcome": out, "correct": bool(ok)}
            for st, sid, out, ok in db.execute(
                "select step, scenario_id, outcome, correct from example_results where job_id = ? order by step, position",
                (job_id,),
            )
        ]
        manifest = json.loads(db.execute("select manifest from jobs where id = ?", (job_id,)).fetchone()[0])
        steps = [
            {"step": s, "reward_mean": r, "loss": loss, "wall_time_s": w,
             **{k: v for k, v in json.loads(m).items()
                if k in ("rollout_s", "train_s", "probs_corr", "kl_policy_ref") or k.startswith("judge")}}  # fmt: skip
            for s, r, loss, w, m in db.execute(
                "select step, reward_mean, loss, wall_time_s, metrics from training_steps where job_id = ? order by step",
                (job_id,),
            )
        ]
        alerts = [{"kind": k, "step": st, "message": msg} for k, st, msg in db.execute(
            "select kind, step, message from alerts where job_id = ? order by id", (job_id,))]  # fmt: skip
        # one stored validation episode per point (the first of each), to read what the policy did at each stage
        episodes = [{"step": st, "reward": r, "messages": json.loads(m), "details": json.loads(d)}
                    for st, r, m, d in db.execute(
            "select step, reward, messages, details from trajectories where job_id = ? and split = 'val' and id in "
            "(select min(id) from trajectories where job_id = ? and split = 'val' group by step) order by step",
            (job_id, job_id))]  # fmt: skip
        timeline = timeline_of(db.execute(
            "select kind, step, created_at from job_events where job_id = ? order by id", (job_id,)))  # fmt: skip
        kept = db.execute("select step, details from trajectories where job_id = ? and split = 'val'", (job_id,))
        episode_metrics = mean_metrics((step, json.loads(details).get("metrics") or {}) for step, details in kept)
    return {"validation": points, "steps": steps, "examples": examples, "manifest": manifest, "alerts": alerts,
            "episodes": episodes, "episode_metrics": episode_metrics, "timeline": timeline}


def timeline_of(events: Any) -> list[dict[str, Any]]:
    """The job's events with the seconds since the one before: what each phase (base validation, warm start, a step,
    a validation) took, read from the store rather than from logs."""
    rows, before = [], None
    for kind, step, created_at in events:
        at = datetime.fromisoformat(created_at)
        rows.append({"kind": kind, "step": step, "seconds": round((at - before).total_seconds(), 1) if before else 0.0})
        before = at
    return rows


def mean_metrics(kept: Any) -> dict[str, dict[str, float]]:
    """Each validation point's stored episodes, their numeric metrics averaged (an agent's: searches, emails read,
    the sources among them, invalid calls): where between the question and the answer a policy goes wrong."""
    sums: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    for step, metrics in kept:
        counts[step] = counts.get(step, 0) + 1
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                sums.setdefault(step, {})[name] = sums.get(step, {}).get(name, 0.0) + float(value)
    return {str(step): {"episodes": n, **{k: round(v / n, 3) for k, v in sums.get(step, {}).items()}}
            for step, n in sorted(counts.items())}  # fmt: skip


def gate(result: dict[str, Any]) -> dict[str, Any]:
    """The promotion gate's verdict on the job's best step against its step 0, from the stored per-example results."""
    job, best = result["summary"]["id"], result["summary"]["best_step"]

    def side(step: int) -> Measured:
        rows = [SimpleNamespace(**e) for e in result["examples"] if e["step"] == step]
        return Measured(id=job, kind="job", step=step, manifest=result["manifest"], results=rows)

    verdict = compare(side(0), side(best), min_delta=GATE_MIN_DELTA)
    return {"baseline_step": 0, "candidate_step": best, "min_delta": GATE_MIN_DELTA,
            **{k: verdict[k] for k in ("decision", "overall", "reasons")}}  # fmt: skip


def _greedy(point: dict[str, Any]) -> str:
    """A point's greedy accuracy, or a dash where the job validated without its greedy pass."""
    return "-" if point["greedy_accuracy"] is None else f"{point['greedy_accuracy']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="", help="appended to the results file's name, e.g. smollm2")
    parser.add_argument("--gate", type=Path, help="only run the gate on this results file, and add it there")
    args, extra = parser.parse_known_args()
    if args.gate is not None:
        result = json.loads(args.gate.read_text())
        result["gate"] = gate(result)
        args.gate.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["gate"]))
        return
    if not args.env:
        parser.error("--env is required (or --gate FILE)")
    result = train_and_read(args.env, args.seed, extra)
    result["gate"] = gate(result)
    RESULTS.mkdir(exist_ok=True)
    name = "twenty48" if args.env == "2048" else args.env
    (RESULTS / f"{name}_rl{'_' + args.label if args.label else ''}.json").write_text(json.dumps(result, indent=2) + "\n")
    summary, points = result["summary"], result["validation"]
    best = next(p for p in points if p["step"] == summary["best_step"])
    step0 = next(p for p in points if p["step"] == 0)  # a warm-started job's base model comes first, at step -1
    print("| env | step-0 val acc (greedy) | best val acc (greedy) | best step | steps | stop | wall time | peak RSS "
          "| CPU |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {args.env} | {step0['accuracy']:.3f} ({_greedy(step0)}) | {best['accuracy']:.3f} "
        f"({_greedy(best)}) | {summary['best_step']} | {summary['step']} | {summary['stop_reason']} "
        f"| {result['wall_time_s'] / 60:.1f} min | {result['peak_rss_gib']:.2f} GiB | {result['cpu_percent']}% |"
    )
    print(f"\n{result['command']}\n{result['machine']}\n")
    busy = ", ".join(f"{name} {p['seconds']:.0f} s at {p['cpu_percent']}%" for name, p in result["cpu_by_phase"].items())
    print(f"CPU by phase (of one core): {busy}\n")
    print("| step | val acc | greedy | outcomes |")
    print("| --- | --- | --- | --- |")
    for p in points:
        outcomes = ", ".join(f"{k} {v}" for k, v in p["outcomes"].items())
        print(f"| {p['step']} | {p['accuracy']:.3f} | {_greedy(p)} | {outcomes} |")
    for step, metrics in result["episode_metrics"].items():
        print(f"stored val episodes at step {step}: {json.dumps(metrics)}")
    print(f"\ngate, step {summary['best_step']} against step 0: {json.dumps(result['gate'])}")


if __name__ == "__main__":
    main()
