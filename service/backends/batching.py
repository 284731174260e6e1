"""When a batch of sampling requests stops forming. A step's rollouts, or a validation's, reach a sampler as separate
HTTP requests over tens of milliseconds; decoding the first few alone and the rest after costs a second pass over the
weights for every token, so a forming batch waits while requests keep coming."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

BATCH_WINDOW_S = 0.02  # a forming batch waits this long for the next request, again while they keep coming
MAX_BATCH_WAIT_S = 0.25  # and no longer in all


async def gathered(size: Callable[[], int]) -> None:
    """Return once ``size()`` (the requests a batch could take) stopped growing for BATCH_WINDOW_S (measured: 16 of a
    step's rollouts came as two batches with a single window), or after MAX_BATCH_WAIT_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MAX_BATCH_WAIT_S
    seen = -1
    while size() != seen and loop.time() < deadline:
        seen = size()
        await asyncio.sleep(BATCH_WINDOW_S)
