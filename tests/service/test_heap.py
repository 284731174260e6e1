"""Freed heap memory goes back to the kernel (heap.py) where the engine turns from sampling to training and back."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import pytest

from service.backends.transformers import heap

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
                           reason="malloc_trim is glibc's")  # fmt: skip


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@glibc
def test_free_pages_between_live_blocks_go_back_to_the_kernel():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 3200  # under glibc's mmap threshold: heap blocks, 200 MiB in all
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks[:-1]:  # the last one stays: the heap's top cannot shrink past it on its own
        libc.free(block)
    before = _rss()
    assert heap.release_freed()
    released = before - _rss()
    libc.free(blocks[-1])
    assert released > 150 * 2**20


def test_the_freed_heap_is_released_once_at_each_turn_between_sampling_and_training(tiny_lm, tmp_path, monkeypatch):
    from service.backends.transformers.engine import LoraSettings, PolicyEngine
    from service.backends.transformers.generation import SamplingRequest
    from tests.service.test_activation_memory import _groups

    released: list[int] = []
    monkeypatch.setattr(heap, "release_freed", lambda: released.append(1) or True)
    engine = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8))
    request = SamplingRequest(prompt_ids=(1, 2, 3), max_tokens=2, seed=0)
    engine.generate([request])
    assert released == []  # the first work of the engine: nothing freed before it
    engine.grpo_step(_groups(), learning_rate=1e-3, config={}, scale_rewards=True)
    assert released == [1]
    engine.grpo_step(_groups(), learning_rate=1e-3, config={}, scale_rewards=True)  # nothing sampled in between
    assert released == [1]
    engine.generate([request])  # a training pass's activations freed before the sampler allocates its batch
    engine.generate([request])
    assert released == [1, 1]
