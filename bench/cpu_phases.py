"""How busy a job's process kept the CPU in each of its phases (issue 31: "over the whole job at least 190%"), and
how much memory it held in each (issue 31: "peak RSS < 3 GiB": which phase sets the peak).

A thread samples the process's CPU time (user + system, /proc/PID/stat) and its resident memory (/proc/PID/statm)
once a ``period``; afterwards each sample's CPU seconds are shared among the phases its interval overlaps, by the
overlap, and each phase's peak is the largest resident memory sampled inside it (a peak shorter than the period
can fall between samples: the process's own high-water mark is the bound's measure). The phases come from the job's own
store: a validation point ends at its ``created_at`` and took its ``wall_time_s``; a step ends at its
``created_at``, its training the ``train_s`` before that and its rollouts the ``rollout_s`` before those. The rest of
the process's life (imports, the model's load, writing checkpoints and the store) is "other". Linux only: elsewhere
no samples are taken and the table is empty.

    with CpuSampler(pid) as sampler: ...            # while the job runs
    busy = phase_cpu(sampler.samples, phases)       # {"training": {"seconds": .., "cpu_percent": .., "peak_rss_gib": ..}}
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

Interval = tuple[float, float]  # (start, end), seconds since the epoch
Sample = tuple[float, float, int]  # (epoch seconds, CPU seconds so far, resident bytes)


class CpuSampler:
    """Samples ``(epoch seconds, CPU seconds so far, resident bytes)`` of process ``pid`` every ``period`` until the
    block ends."""

    def __init__(self, pid: int, period: float = 1.0) -> None:
        self.pid, self.period = pid, period
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            used, resident = cpu_seconds(self.pid), resident_bytes(self.pid)
            if used is not None and resident is not None:
                self.samples.append((time.time(), used, resident))
            if self._stop.wait(self.period):
                return


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of ``pid`` and the threads it has, or None once it is gone (or off Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime and stime, fields 14 and 15 of proc(5)


def resident_bytes(pid: int) -> int | None:
    """``pid``'s resident memory now (0 once it exited, until it is reaped), or None once it is gone (or off Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE
    except OSError:
        return None


def _epoch(created_at: str) -> float:
    """A store timestamp (naive UTC, as SQLite holds it) in seconds since the epoch."""
    at = datetime.fromisoformat(created_at)
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def job_phases(
    validation: list[tuple[str, float | None]], steps: list[tuple[str, dict[str, Any]]]
) -> dict[str, list[Interval]]:
    """The job's phases from its stored validation points ``(created_at, wall_time_s)`` and steps ``(created_at,
    metrics)``."""
    phases: dict[str, list[Interval]] = {"validation": [], "rollouts": [], "training": []}
    for created_at, seconds in validation:
        if seconds:
            end = _epoch(created_at)
            phases["validation"].append((end - seconds, end))
    for created_at, metrics in steps:
        end, train, rollouts = _epoch(created_at), metrics.get("train_s") or 0.0, metrics.get("rollout_s") or 0.0
        phases["training"].append((end - train, end))
        phases["rollouts"].append((end - train - rollouts, end - train))
    return phases


def _overlap(a: Interval, b: Interval) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def phase_cpu(samples: list[Sample], phases: dict[str, list[Interval]]) -> dict[str, dict[str, float]]:
    """Each phase's wall seconds, its CPU as a percentage of one core (200: two cores busy) and the most memory
    sampled inside it (GiB; 0 where no sample fell inside), and "other" for the sampled time outside every phase;
    the phases are taken not to overlap each other."""
    totals = {name: [0.0, 0.0] for name in [*phases, "other"]}  # wall seconds, CPU seconds
    peaks = dict.fromkeys(totals, 0)
    for at, _, resident in samples:
        inside = next((name for name, intervals in phases.items() if any(a <= at <= b for a, b in intervals)), "other")
        peaks[inside] = max(peaks[inside], resident)
    for (start, before, _), (end, after, _) in zip(samples, samples[1:]):
        span, used = end - start, after - before
        if span <= 0:
            continue
        covered = 0.0
        for name, intervals in phases.items():
            share = sum(_overlap((start, end), interval) for interval in intervals)
            totals[name][0] += share
            totals[name][1] += used * share / span
            covered += share
        rest = max(0.0, span - covered)
        totals["other"][0] += rest
        totals["other"][1] += used * rest / span
    return {name: {"seconds": round(wall, 1), "cpu_percent": round(100 * cpu / wall) if wall else 0,
                   "peak_rss_gib": round(peaks[name] / 2**30, 2)}
            for name, (wall, cpu) in totals.items()}  # fmt: skip
