"""Python's cyclic garbage collector kept out of the way of the objects that live as long as the process or its model:
frozen once made (``gc.freeze``), and not run at all while they are being made (imports, a model's load).

A full collection walks every object the collector tracks. Once torch, transformers, ART and a model are loaded that is
about 700,000 objects, and a full collection took 0.3-0.5 s: the main job ran 9-10 of them after its model loaded,
3.8-4.5 s on a 2-core Zen 5 (README Results), each stalling whichever thread allocated, the event loop answering the
rollouts' requests or the model thread, and with it both cores. Frozen objects are never scanned (they are not
garbage), and a full collection then walks only what is younger: 0.03-0.09 s.

A frozen object in a reference cycle is never freed either, so whenever a holder lets go (a worker's job ends: its model,
its cycles included, must be collected) everything is unfrozen, collected once, and frozen again for the holders left.
The API process freezes its start-up for good.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

_lock = threading.RLock()  # a collection runs finalizers, which may hold or let go
_holders = 0  # holds on the frozen generation in this process
_pauses = 0  # collector_paused blocks open in this process; the last to end enables the collector again
_enable_after = False  # whether the collector ran when the first of them began


def freeze_startup_objects() -> None:
    """Freeze what start-up made for the life of the process."""
    hold_frozen()  # never let go


def hold_frozen() -> Callable[[], None]:
    """Collect the garbage there is (a frozen cycle would be kept until the release: a model load's leftovers), then
    freeze every object left. The returned function lets go, once: everything is unfrozen (a move of lists, whatever
    their length), and while other holds remain, collected and frozen again, so what died since (a finished job's
    model, with the other jobs of a worker still running) is freed all the same."""
    global _holders
    with _lock:
        gc.collect()
        gc.freeze()
        _holders += 1
    released = False

    def release() -> None:
        nonlocal released
        global _holders
        with _lock:
            if released:
                return
            released = True
            _holders -= 1
            gc.unfreeze()
            if _holders:
                gc.collect()
                gc.freeze()

    return release


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside. Importing torch, transformers and ART, or loading a model, makes hundreds of thousands of
    objects and hardly any garbage, yet every 700 allocations start a collection and every hundredth of those walks all
    made so far: 10 full ones, 1.5-2.3 s, before the main job's first rollout on a 2-core Zen 5 (README Results). Blocks
    may nest and overlap across threads; the collector runs again once the last one ends (where it ran before the
    first). Freeze after it (hold_frozen collects first), so what it made is never walked."""
    global _pauses, _enable_after
    with _lock:
        if _pauses == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _enable_after:
                gc.enable()
