"""Memory the process freed, handed back to the kernel where the engine turns from sampling to training and back.

glibc keeps freed heap blocks for the process's next allocations. After sampling (a batch's cache, its logits, the
prefix cache's states) about 0.6 GiB of them stayed in the main job's heap, scattered between live blocks, and a
training pass that keeps its activations (activation_memory.py) took fresh pages beside them: the job's peak was the
sampler's leftovers plus the pass. The other way round too: a pass's freed activations stayed while the next
rollouts' batch took pages of its own, and the main job's resident memory, sampled every second, peaked in its
rollouts and validations (3.05-3.07 GiB on a 2-core AMX Xeon, its training passes at most 2.69). ``malloc_trim`` gives
every whole free page back, so each phase's peak is its own. Elsewhere (another C library, another system) this does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def release_freed() -> bool:
    """Hand the heap's free pages back to the kernel; whether this C library can."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
