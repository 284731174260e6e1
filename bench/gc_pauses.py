"""Benchmark: how long Python's cyclic garbage collector stops a job, as shipped (no collection while torch, ART and
the model load; the model's objects frozen after: service/gc_frozen.py) and with the collector as Python sets it,
the sides alternated in one run.

Each round runs ``artsvc train`` (the README's main job unless other flags are given) twice in fresh data
directories: once as shipped, once with ``collector_paused`` and ``hold_frozen`` doing nothing. The job's process
times every collection (``gc.callbacks``: generation, thread, seconds) and when the backend froze (or would have
frozen) its objects; this reports each side's collections before and after that point, the job's wall time and CPU,
and the medians.

    python bench/gc_pauses.py [--rounds 2] [--label zen5] [artsvc train flags, e.g. --max-steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

RESULTS = Path(__file__).resolve().parent / "results"
SIDES = ("shipped", "python_default")


def child(out: Path, shipped: bool, train_args: list[str]) -> None:
    """Run ``artsvc train`` in this process, timing each collection; the record goes to ``out`` at exit."""
    import atexit
    import contextlib
    import gc
    import threading

    started, begun = time.monotonic(), {}
    record: dict[str, Any] = {"collections": [], "frozen_at_s": None}

    def timed(phase: str, info: dict[str, int]) -> None:
        ident = threading.get_ident()
        if phase == "start":
            begun[ident] = time.perf_counter()
        elif ident in begun:
            seconds = time.perf_counter() - begun.pop(ident)
            record["collections"].append([round(time.monotonic() - started, 3), info["generation"], round(seconds, 5),
                                          threading.current_thread().name])  # fmt: skip

    gc.callbacks.append(timed)
    # before anything imports them by name: as shipped (recording when the backend froze), or neither pause nor freeze
    from service import gc_frozen

    shipped_hold = gc_frozen.hold_frozen

    def hold() -> Any:
        record["frozen_at_s"] = round(time.monotonic() - started, 3)
        return shipped_hold() if shipped else (lambda: None)

    gc_frozen.hold_frozen = hold
    if not shipped:
        gc_frozen.collector_paused = contextlib.nullcontext
    atexit.register(lambda: out.write_text(json.dumps(record)))
    from service.cli import main

    sys.argv = ["artsvc", "train", *train_args]
    main()


def run_side(shipped: bool, train_args: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="artsvc-gc-") as data_dir:
        out = Path(data_dir) / "gc.json"
        env = {k: v for k, v in os.environ.items() if k != "ARTSVC_DATABASE_URL"} | {"ARTSVC_DATA_DIR": data_dir}
        command = [sys.executable, __file__, "--child", str(out), "--side", "shipped" if shipped else "python_default",
                   "--", "--json", *train_args]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begun = time.monotonic()
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True)
        wall = time.monotonic() - begun
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        record = json.loads(out.read_text())
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        from env_rl import read_job

        stored = read_job(Path(data_dir) / "artsvc.db", summary["id"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    phases = {"steps_s": round(sum(s["wall_time_s"] for s in stored["steps"]), 1),
              "rollouts_s": round(sum(s["rollout_s"] for s in stored["steps"]), 1),
              "training_s": round(sum(s["train_s"] for s in stored["steps"]), 1),
              "validations_s": round(sum(p["wall_time_s"] or 0.0 for p in stored["validation"]), 1)}  # fmt: skip
    return {"wall_time_s": round(wall, 1), "cpu_percent": round(100 * cpu / wall), "steps": summary["step"],
            "stop_reason": summary["stop_reason"], **phases, **split_at_freeze(record)}  # fmt: skip


def split_at_freeze(record: dict[str, Any]) -> dict[str, Any]:
    """The collections' count and seconds before the backend's freeze point (imports, the model's load) and after it
    (the job), full ones (generation 2) apart, and by thread after it."""
    at = record["frozen_at_s"] if record["frozen_at_s"] is not None else float("inf")
    parts: dict[str, Any] = {}
    for when, keep in (("before", lambda t: t < at), ("after", lambda t: t >= at)):
        rows = [c for c in record["collections"] if keep(c[0])]
        full = [c for c in rows if c[1] == 2]
        parts[when] = {"collections": len(rows), "seconds": round(sum(c[2] for c in rows), 3),
                       "full_collections": len(full), "full_seconds": round(sum(c[2] for c in full), 3),
                       "longest_full_s": round(max((c[2] for c in full), default=0.0), 3)}  # fmt: skip
    threads: dict[str, float] = {}
    for c in record["collections"]:
        if c[0] >= at:
            threads[c[3]] = round(threads.get(c[3], 0.0) + c[2], 3)
    parts["after"]["seconds_by_thread"] = threads
    parts["frozen_at_s"] = record["frozen_at_s"]
    return parts


def median_of(runs: list[dict[str, Any]], *path: str) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        values.append(value)
    return round(statistics.median(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args, train_args = parser.parse_known_args()
    train_args = [a for a in train_args if a != "--"]
    if args.child is not None:
        return child(args.child, args.side == "shipped", train_args)
    train_args = train_args or ["--env", "math", "--seed", "0"]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        order = SIDES if round_ % 2 == 0 else SIDES[::-1]  # each side first in turn
        for side in order:
            runs[side].append(run_side(side == "shipped", train_args))
            print(side, json.dumps(runs[side][-1]), flush=True)
    medians = {side: {"gc_after_s": median_of(r, "after", "seconds"),
                      "full_after": median_of(r, "after", "full_collections"),
                      "gc_before_s": median_of(r, "before", "seconds"), "wall_time_s": median_of(r, "wall_time_s"),
                      **{k: median_of(r, k) for k in ("steps_s", "rollouts_s", "training_s", "validations_s")},
                      "cpu_percent": median_of(r, "cpu_percent")} for side, r in runs.items()}  # fmt: skip
    from env_rl import machine  # not in the child: nothing may import the service before it patches gc_frozen

    result = {"machine": machine(), "train_args": train_args, "runs": runs, "medians": medians}
    RESULTS.mkdir(exist_ok=True)
    name = f"gc_pauses{'_' + args.label if args.label else ''}.json"
    (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
