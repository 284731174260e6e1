"""How a training process shares the CPU: how its torch threads wait for each other, and how a worker under
``artsvc serve`` gives the API the CPU first.

torch's OpenMP threads wait for each other at the end of every parallel region, and a decode step is hundreds of
regions of a millisecond or less. libgomp lets a waiting thread spin or sleep (``bench/omp_wait.py``, a loop of
64x576 by 576x1536 products, the decode step's shape; 2-core AMD EPYC with AVX512-BF16, bf16, medians of 3 rounds):

- alone on the machine, threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``) ran it at 205 GFLOP/s on 163% CPU;
  a bounded spin (``GOMP_SPINCOUNT=10000``: about 0.1 ms, then sleep) at 290 on 194%, 1.47x; spinning
  without bound (``ACTIVE``) at 265;
- beside one busy process, sleeping threads kept 183 GFLOP/s while either spin halved it (98 and 93).

So ``artsvc train``, which has the machine to itself, spins briefly (``wait_briefly``); a supervised worker, which
shares the cores with the API and other workers, sleeps (``wait_passively``). Either applies only where the operator
set neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT``, and must run before torch loads (libgomp reads them once).
They change how threads wait, never what they compute.

The spin holds only while one thread runs torch's parallel work. libgomp keeps a pool of workers for every thread that
has started a parallel region, for that thread's life, and once it manages more threads than the process has CPUs it
cuts every waiting thread's spin to a hundred rounds: as if ``PASSIVE``. So the model thread does all of a job's
tensor work and the event loop none that is parallel (a two-step main job ran four scalar operations on the main
thread). One sum of a million elements on the main thread made the model thread's decode-shaped products 1.64-1.78x
slower for the rest of the process, 130-133% CPU against 196-198% (``bench/omp_masters.py``, three runs, a 2-core AMX
Xeon, bf16).

A supervised worker also lowers its priority (``yield_cpu``). A higher niceness only weights the shares, and the
scheduler may let a running worker thread finish its time slice before the API, woken by a request, gets the core.
Linux's SCHED_IDLE gives a worker only the CPU time that nothing at normal priority wants, and a task that wakes
preempts it at once. Alternated on one live job (the worker's threads
switched every 15 s, seven rounds each, ``bench/worker_cpu_ab.py``), medians over rounds: GET p99 64.3 against
79.7 ms, 1.14x the requests a second, and a lower GET p99 in 6 of 7 rounds.
"""

from __future__ import annotations

import os

WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
BRIEF_SPIN = "10000"  # spins of a waiting thread before it sleeps: about a tenth of a millisecond


def _unless_set(name: str, value: str) -> None:
    if not any(key in os.environ for key in WAIT_SETTINGS):
        os.environ[name] = value


def wait_passively() -> None:
    """Waiting threads sleep at once: for a process that shares the cores."""
    _unless_set("OMP_WAIT_POLICY", "PASSIVE")


def wait_briefly() -> None:
    """Waiting threads spin briefly, then sleep: for a process that has the machine to itself."""
    _unless_set("GOMP_SPINCOUNT", BRIEF_SPIN)


def yield_cpu(*, policy: str, nice: int) -> None:
    """Lower this process's CPU priority, before it starts any thread (threads inherit it): ``idle``, SCHED_IDLE where
    the system has it and lets us (Linux), else as ``nice``; ``nice``, its niceness raised by ``nice``."""
    if policy == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError:  # a sandbox that filters the call: niceness still works
            pass
    if nice:
        os.nice(nice)
