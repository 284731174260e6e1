"""Long-lived objects frozen out of the garbage collector's way (gc_frozen.py), and given back when the last hold lets
go: a worker's finished job must not keep its model alive through a frozen reference cycle."""

from __future__ import annotations

import gc
import threading
import weakref

import art
import pytest

from service import gc_frozen
from service.backends import layout
from service.backends.transformers.backend import TransformersBackend
from service.backends.transformers.engine import LoraSettings


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def no_holds(monkeypatch):
    """This process's holds counted from none, and what was frozen before the test frozen again after it."""
    was_frozen = gc.get_freeze_count() > 0
    monkeypatch.setattr(gc_frozen, "_holders", 0)
    yield
    gc.unfreeze()  # what a failed test left held
    if was_frozen:
        gc.freeze()


def test_a_hold_frees_the_garbage_there_is_then_keeps_the_living_out_of_collections(no_holds):
    dropped, kept = Node(), Node()
    dropped_ref, kept_ref = weakref.ref(dropped), weakref.ref(kept)
    gc.disable()  # so that only the hold can collect ``dropped``
    try:
        del dropped
        release = gc_frozen.hold_frozen()
    finally:
        gc.enable()
    assert dropped_ref() is None
    assert gc.get_freeze_count() > 0
    del kept
    gc.collect()
    assert kept_ref() is not None  # frozen: no collection walks it
    release()
    gc.collect()
    assert kept_ref() is None and gc.get_freeze_count() == 0


def test_the_last_hold_to_let_go_unfreezes_and_each_lets_go_once(no_holds):
    first, second = gc_frozen.hold_frozen(), gc_frozen.hold_frozen()
    first()
    first()  # a second call changes nothing
    assert gc.get_freeze_count() > 0
    second()
    assert gc.get_freeze_count() == 0


def test_what_died_under_a_released_hold_is_collected_while_other_holds_remain(no_holds):
    """A worker that trains two jobs at once: the first job's model is freed when it ends, the second still running."""
    finished, running = Node(), Node()
    finished_ref, running_ref = weakref.ref(finished), weakref.ref(running)
    first = gc_frozen.hold_frozen()
    second = gc_frozen.hold_frozen()
    del finished
    first()
    assert finished_ref() is None
    assert gc.get_freeze_count() > 0  # frozen again for the hold that remains
    del running
    gc.collect()
    assert running_ref() is not None
    second()
    gc.collect()
    assert running_ref() is None


def test_no_collection_runs_while_a_pause_lasts_and_the_last_pause_to_end_turns_the_collector_back_on():
    assert gc.isenabled()
    collections = []
    gc.callbacks.append(counted := lambda phase, info: collections.append(info) if phase == "start" else None)
    try:
        with gc_frozen.collector_paused():
            _ = [Node() for _ in range(20_000)]  # enough new objects to start collections, were the collector on
            with gc_frozen.collector_paused():
                pass
            assert not gc.isenabled()  # the inner pause ended, the outer goes on
            during = len(collections)
        assert during == 0 and gc.isenabled()
    finally:
        gc.callbacks.remove(counted)


def test_pauses_on_two_threads_overlap_and_a_collector_that_was_off_stays_off():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with gc_frozen.collector_paused():
            first_in.set()
            second_in.wait()
        first_out.set()

    worker = threading.Thread(target=first)
    worker.start()
    first_in.wait()
    with gc_frozen.collector_paused():
        second_in.set()
        first_out.wait()
        assert not gc.isenabled()  # the other thread's pause ended first
    worker.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_frozen.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.asyncio
async def test_a_backend_freezes_its_loaded_model_and_a_cycle_through_it_is_collected_once_closed(
    no_holds, tiny_lm, tmp_path
):
    backend = TransformersBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", lora=LoraSettings(rank=8))
    model = art.TrainableModel(name="tiny", project=layout.PROJECT, base_model=str(tiny_lm),
                               base_path=str(tmp_path / "art"))  # fmt: skip
    assert gc.get_freeze_count() == 0
    await model.register(backend)
    engine = weakref.ref(backend._engine(model.name))
    assert gc.get_freeze_count() > 0
    engine().cycle = Node()  # whatever else holds it, a cycle through the model must not outlive the job
    engine().cycle.engine = engine()
    await backend.close()
    assert gc.get_freeze_count() == 0
    del backend, model
    gc.collect()
    assert engine() is None
