"""Benchmark: the store's work per training step, early in a long job and late in it.

A real job runs through ``run_job`` (the worker's code path) for thousands of steps on the fastest
configuration there is: the embedded backend's tiniest policy (``embedded/char-gpt-0.2m``), one group
of two rollouts a step, no warm start, and validation on one example every ``--every`` steps. The
training itself is real but tiny, so the store is a large share of each step, which is what is measured.

Store time of a step: the wall time its SQLAlchemy sessions held a transaction (from ``after_begin`` to
the root transaction's end; that includes loading rows into objects and the alert rules that run inside
the write), summed over the interval from one "step" event to the next, and the CPU time of the thread
that ran them over the same spans (what other processes on a shared machine do not move; on SQLite it
is all the store's work, on PostgreSQL the server's share is missing from it); statements are counted
with ``before_cursor_execute``. Intervals with a validation are reported apart (a validation records more).
Besides the first and last 100 steps, the medians of each tenth of the run show whether the cost trends.

    python bench/store_per_step.py [--steps 2000] [--every 10] [--database-url URL] [--out NAME]

``--database-url`` takes a PostgreSQL URL (a fresh database is created on that server and dropped after);
the default is a SQLite file in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

from sqlalchemy import create_engine, event, text
from sqlalchemy.orm import Session as OrmSession
from sqlmodel import Session

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "bench"))
from env_rl import machine

EDGE = 100  # steps compared at each end of the job
TENTHS = 10  # the run cut into this many spans of steps, each summed up by its median: the trend, less the noise


class StoreMeter:
    """Store time (wall, and CPU of the thread that runs the sessions) and statements, bucketed into the
    intervals between "step" events."""

    def __init__(self) -> None:
        self.seconds, self.cpu_seconds, self.statements, self.validation = 0.0, 0.0, 0, False
        self.intervals: list[dict] = []
        self._open: dict[int, tuple[float, float]] = {}

    def attach(self, engine) -> None:
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(OrmSession, "after_begin", self._begin)
        event.listen(OrmSession, "after_transaction_end", self._end)

    def _statement(self, *_: object) -> None:
        self.statements += 1

    def _begin(self, session, transaction, _connection) -> None:
        self._open.setdefault(id(session), (time.perf_counter(), time.thread_time()))

    def _end(self, session, transaction) -> None:
        started = self._open.pop(id(session), None) if transaction.parent is None else None
        if started is not None:
            self.seconds += time.perf_counter() - started[0]
            self.cpu_seconds += time.thread_time() - started[1]

    def on_event(self, kind: str, data: dict) -> None:
        if kind == "validation":
            self.validation = True
        if kind == "step":
            self.intervals.append({"step": data["step"], "store_s": self.seconds, "store_cpu_s": self.cpu_seconds,
                                   "statements": self.statements, "validation": self.validation})  # fmt: skip
            self.seconds, self.cpu_seconds, self.statements, self.validation = 0.0, 0.0, 0, False


def postgres_database(server_url: str) -> tuple[str, Callable[[], None]]:
    """A fresh database on the server of ``server_url``, and a function that drops it."""
    base, name = server_url.rsplit("/", 1)[0], f"artsvc_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{base}/{name}", drop


def run(url: str, data_dir: Path, steps: int, every: int) -> tuple[StoreMeter, float]:
    from service.runner.control import JobHooks
    from service.spec import JobSpec
    from service.store import db as store_db
    from service.store import runs
    from service.training.loop import run_job

    store_db.upgrade(url)
    engine = store_db.make_engine(url)
    spec = {"environment": "math", "model": {"base_model": "embedded/char-gpt-0.2m"}, "seed": 1,
            "training": {"warm_start_examples": 0, "max_steps": steps, "groups_per_step": 1, "group_size": 2},
            "validation": {"every_n_steps": every, "max_examples": 1, "patience": 1000}}  # fmt: skip
    with Session(engine) as session:
        job_id = runs.create_job(session, spec=JobSpec.model_validate(spec)).id
        session.commit()
    meter = StoreMeter()
    meter.attach(engine)
    started = time.monotonic()
    job = asyncio.run(run_job(job_id, db=engine, data_dir=data_dir, hooks=JobHooks(on_event=meter.on_event)))
    wall = time.monotonic() - started
    engine.dispose()
    if job.step != steps:
        sys.exit(f"the job stopped at step {job.step} ({job.stop_reason}), not {steps}")
    return meter, wall


def summary(intervals: list[dict]) -> dict:
    plain = [i for i in intervals[1:] if not i["validation"]]  # the first follows the step-0 validation and start-up
    first, last = plain[:EDGE], plain[-EDGE:]
    first_ms = statistics.mean(i["store_s"] for i in first) * 1000
    last_ms = statistics.mean(i["store_s"] for i in last) * 1000
    validated = [i["statements"] for i in intervals[1:] if i["validation"]]
    first_cpu_ms = statistics.mean(i["store_cpu_s"] for i in first) * 1000
    last_cpu_ms = statistics.mean(i["store_cpu_s"] for i in last) * 1000
    return {
        "first_100_store_ms_per_step": round(first_ms, 3),
        "last_100_store_ms_per_step": round(last_ms, 3),
        "ratio_last_to_first": round(last_ms / first_ms, 3),
        "first_100_store_cpu_ms_per_step": round(first_cpu_ms, 3),
        "last_100_store_cpu_ms_per_step": round(last_cpu_ms, 3),
        "cpu_ratio_last_to_first": round(last_cpu_ms / first_cpu_ms, 3),
        "first_100_median_store_ms": round(statistics.median(i["store_s"] for i in first) * 1000, 3),
        "last_100_median_store_ms": round(statistics.median(i["store_s"] for i in last) * 1000, 3),
        "statements_per_step": sorted({i["statements"] for i in plain}),
        "statements_per_step_with_validation": sorted(set(validated)),
        "first_100_statements": statistics.mean(i["statements"] for i in first),
        "last_100_statements": statistics.mean(i["statements"] for i in last),
        **by_tenth(plain),
    }


def by_tenth(plain: list[dict]) -> dict:
    """Medians of each tenth of the run, and the last tenth's against the first's. Two windows of 100 steps move by
    tens of percent from run to run on a shared machine, either way; a cost that grows with the job's length shows
    here as a rising series, and noise as one that goes up and down."""
    size = len(plain) // TENTHS
    spans = [plain[k * size : (k + 1) * size] for k in range(TENTHS)]
    wall = [round(statistics.median(i["store_s"] for i in span) * 1000, 3) for span in spans]
    cpu = [round(statistics.median(i["store_cpu_s"] for i in span) * 1000, 3) for span in spans]
    return {
        "store_ms_median_by_tenth": wall,
        "store_cpu_ms_median_by_tenth": cpu,
        "tenths_ratio_last_to_first": round(wall[-1] / wall[0], 3),
        "tenths_cpu_ratio_last_to_first": round(cpu[-1] / cpu[0], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=10, help="validate every this many steps")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server URL; default: a SQLite file")
    parser.add_argument("--out", default=None, help="result file name under bench/results (default by database)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artsvc-store-") as tmp:
        url, drop = (f"sqlite:///{Path(tmp) / 'store.db'}", lambda: None)
        if args.database_url:
            url, drop = postgres_database(args.database_url)
        try:
            meter, wall = run(url, Path(tmp) / "data", args.steps, args.every)
        finally:
            drop()
    database = "postgresql" if args.database_url else "sqlite"
    result = {
        "machine": machine(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "database": database,
        "steps": args.steps,
        "validate_every": args.every,
        "job_wall_s": round(wall, 1),
        **summary(meter.intervals),
        "store_ms_by_step": [round(i["store_s"] * 1000, 3) for i in meter.intervals],
        "store_cpu_ms_by_step": [round(i["store_cpu_s"] * 1000, 3) for i in meter.intervals],
        "statements_by_step": [i["statements"] for i in meter.intervals],
    }
    RESULTS.mkdir(exist_ok=True)
    out = args.out or ("store_per_step.json" if database == "sqlite" else f"store_per_step_{database}.json")
    (RESULTS / out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_by_step")}, indent=1))


if __name__ == "__main__":
    main()
