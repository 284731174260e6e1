"""How a training process shares the CPU: its torch threads wait for each other asleep, not spinning.

torch's OpenMP threads spin while they wait for each other at the end of every parallel region (libgomp's
active wait). Where anything else runs beside them (the API answering requests, another worker, a browser), a
spinning thread burns the core its partner needs. Measured on 2 cores with one busy process beside it: a loop of
64×576 by 576×1536 products took 15.3 s on 2 threads and 2.4 s on 1; with passive waits, 3.0 s on 2. Alone on
the machine, passive waits cost 3% (1.58 s against 1.53 s). Every
training process therefore waits passively unless the operator set ``OMP_WAIT_POLICY`` (libgomp reads it once,
when torch loads: call this first). It changes how threads wait, never what they compute.
"""

from __future__ import annotations

import os


def wait_passively() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
