"""service/cpu.py: how a supervised worker yields the CPU to the API (each case in a process of its own: a lowered
priority cannot be raised again without privileges)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from service.cpu import yield_cpu

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")


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


def test_idle_puts_a_worker_in_sched_idle_and_leaves_its_niceness():
    assert settled("idle", 10) == (os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, 0))


def test_nice_raises_its_niceness_under_the_normal_policy():
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert settled("nice", 10) == (os.SCHED_OTHER, min(ours + 10, 19))
    assert settled("nice", 0) == (os.SCHED_OTHER, ours)
