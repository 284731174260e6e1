"""The sampler's batch cache (batch_cache.py): each row's states copied once, into buffers with room for what the
prefill and the decoding add, which is then written in place."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from service.backends.transformers.batch_cache import growing_cache, left_padded
from service.backends.transformers.prefix_cache import States

LAYERS, HEADS, DIMS = 2, 2, 4


def states(length: int, seed: int, rows: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random keys and values of every layer: ``[heads, length, dims]``, or ``[rows, heads, length, dims]``."""
    generator = torch.Generator().manual_seed(seed)
    shape = (HEADS, length, DIMS) if rows is None else (rows, HEADS, length, DIMS)
    return [(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)) for _ in range(LAYERS)]


def places(cache: DynamicCache) -> list[int]:
    return [t.data_ptr() for layer in cache.layers for t in (layer.keys, layer.values)]


def test_rows_are_right_aligned_after_zeros_and_what_fits_the_room_is_written_where_they_are():
    long, short = states(5, seed=1), states(3, seed=2)
    cache, mask = left_padded([(5, States.of(long)), (3, States.of(short))], torch.device("cpu"), room=4)
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    for layer, held in enumerate(cache.layers):
        for got, first, second in zip((held.keys, held.values), long[layer], short[layer]):
            assert torch.equal(got[0], first) and torch.equal(got[1, :, 2:], second)
            assert not got[1, :, :2].any()  # padding is zeros the mask hides, never stale memory
    before = places(cache)
    reference = DynamicCache([(layer.keys.clone(), layer.values.clone()) for layer in cache.layers])
    for added in (3, 1):  # the prompts' rest, then a decoded token: 4 positions, the room asked for
        for layer, (keys, values) in enumerate(states(added, seed=added, rows=2)):
            grown, plain = cache.update(keys, values, layer), reference.update(keys, values, layer)
            assert all(torch.equal(a, b) for a, b in zip(grown, plain))
    assert places(cache) == before  # no copy of the states
    for layer, (keys, values) in enumerate(states(1, seed=9, rows=2)):  # past the room: made again, larger
        grown, plain = cache.update(keys, values, layer), reference.update(keys, values, layer)
        assert all(torch.equal(a, b) for a, b in zip(grown, plain))
    assert cache.get_seq_length() == 5 + 4 + 1


def test_positions_held_apart_are_left_out_of_every_row():
    long, short = states(6, seed=3), states(4, seed=4)
    cache, mask = left_padded([(6, States.of(long)), (4, States.of(short))], torch.device("cpu"), start=2)
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert torch.equal(cache.layers[1].keys[0], long[1][0][:, 2:])
    assert torch.equal(cache.layers[1].values[1, :, 2:], short[1][1][:, 2:])


def test_an_empty_cache_keeps_its_first_states_once_with_room_to_grow():
    cache = growing_cache()
    first = states(7, seed=5, rows=3)
    for layer, (keys, values) in enumerate(first):
        held = cache.update(keys, values, layer)
        assert torch.equal(held[0], keys) and torch.equal(held[1], values)
    before = places(cache)
    for layer, (keys, values) in enumerate(states(1, seed=6, rows=3)):
        cache.update(keys, values, layer)
    assert places(cache) == before and cache.get_seq_length() == 8
