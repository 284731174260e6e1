"""service/cpu.py: how training threads wait, and how a supervised worker yields the CPU to the API (each case in a
process of its own: libgomp reads its settings once, and a lowered priority cannot be raised again unprivileged)."""

from __future__ import annotations

import ast
import multiprocessing
import os
import subprocess
import sys

import pytest

from service.cpu import WAIT_SETTINGS, yield_cpu

LINUX_ONLY = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


def _yield_and_report(policy: str, nice: int, report: multiprocessing.Queue) -> None:
    yield_cpu(policy=policy, nice=nice)
    report.put((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)))


def settled(policy: str, nice: int) -> tuple[int, int]:
    """The scheduling policy and niceness of a fresh process after ``yield_cpu(policy=policy, nice=nice)``."""
    context = multiprocessing.get_context("spawn")
    report = context.Queue()
    child = context.Process(target=_yield_and_report, args=(policy, nice, report))
    child.start()
    try:
        return report.get(timeout=60)
    finally:
        child.join(30)


@LINUX_ONLY
def test_idle_puts_a_worker_in_sched_idle_and_leaves_its_niceness():
    assert settled("idle", 10) == (os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, 0))


@LINUX_ONLY
def test_nice_raises_its_niceness_under_the_normal_policy():
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert settled("nice", 10) == (os.SCHED_OTHER, min(ours + 10, 19))
    assert settled("nice", 0) == (os.SCHED_OTHER, ours)


def _waits_after(call: str, **preset: str) -> dict[str, str | None]:
    """The OpenMP wait settings of a fresh interpreter, started with only ``preset`` of them, after ``call``."""
    env = {key: value for key, value in os.environ.items() if key not in WAIT_SETTINGS} | preset
    script = f"import os, service.cpu as cpu; cpu.{call}(); print([os.environ.get(k) for k in cpu.WAIT_SETTINGS])"
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    return dict(zip(WAIT_SETTINGS, ast.literal_eval(out)))


def test_a_process_with_the_machine_to_itself_spins_briefly_and_one_that_shares_it_sleeps():
    assert _waits_after("wait_briefly") == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "10000"}
    assert _waits_after("wait_passively") == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}


def test_the_operators_wait_settings_are_kept():
    kept = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}
    assert _waits_after("wait_briefly", OMP_WAIT_POLICY="ACTIVE") == kept
    assert _waits_after("wait_passively", GOMP_SPINCOUNT="500") == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "500"}
