"""A batch's key-value cache laid out for decoding: one row a sample, left-padded, a 0/1 attention mask beside it.

Positions are the mask's running count, so rows of different lengths share one cache: padding is zeros the mask
hides. These functions build such a cache from single rows' states (a prefix cache's entries), take a row's states
back out, and drop the rows that finished.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from service.backends.transformers.prefix_cache import KV, States

# A buffer's room past its states when it is (re)made: 32 positions, or an eighth of its length where that is more, so
# a reply of 96 tokens after 1,200 makes it again about 3 times, and a short math batch holds little spare memory.
HEADROOM_TOKENS = 32


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are the start of buffers with room to grow: a decoded token's states are
    written in place. transformers' DynamicLayer concatenates the whole cache anew for every token (``torch.cat``),
    which for an agent's 16 rows of 1,200 tokens was a third of a decoding step. A buffer is made again (one copy)
    when it is full or the states were replaced (rows selected, reordered, cut)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None):
        if not self.is_initialized or self.keys.numel() == 0:  # empty: no states to keep, the buffers made below
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states[:, :, :0], value_states[:, :, :0]
        length, added = self.keys.shape[-2], key_states.shape[-2]
        if not self._holds(length + added):
            self._buffers = tuple(self._buffer(t, length + added + max(HEADROOM_TOKENS, length // 8))
                                  for t in (self.keys, self.values))  # fmt: skip
        keys, values = self._buffers
        keys[:, :, length : length + added], values[:, :, length : length + added] = key_states, value_states
        self.keys, self.values = keys[:, :, : length + added], values[:, :, : length + added]
        return self.keys, self.values

    @classmethod
    def within(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> GrowingLayer:
        """A layer whose states are the first ``length`` positions of the buffers ``keys`` and ``values`` (no copy):
        what later updates add is written after them while it fits. transformers' own first update concatenates the
        states onto an empty tensor, a copy of the whole cache; the update after it, with no room, made another."""
        layer = cls()
        layer.lazy_initialization(keys, values)
        layer._buffers = (keys, values)
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        return layer

    def _holds(self, length: int) -> bool:
        """Whether the states are the start of the buffers, and these have room for ``length`` positions."""
        buffers = getattr(self, "_buffers", None)
        return (buffers is not None and buffers[0].shape[2] >= length and buffers[0].shape[:2] == self.keys.shape[:2]
                and all(b.data_ptr() == t.data_ptr() for b, t in zip(buffers, (self.keys, self.values))))  # fmt: skip

    @staticmethod
    def _buffer(states: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, heads, length, dims = states.shape
        buffer = states.new_empty(batch, heads, capacity, dims)
        buffer[:, :, :length] = states
        return buffer


def growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DynamicCache:
    """A DynamicCache of GrowingLayers, holding ``layers``' states; empty, its layers are made as a model fills it."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    cache.layers.extend(GrowingLayer.within(keys, values, keys.shape[-2]) for keys, values in layers or ())
    return cache


def left_padded(
    bases: list[tuple[int, States | None]], device: torch.device, *, start: int = 0, room: int = 0
) -> tuple[DynamicCache, torch.Tensor]:
    """A cache with one row per ``(length, states)``, positions ``start`` to ``length`` of ``states`` right-aligned,
    and its mask (the first ``start`` positions, alike in every row, are held apart: ``shared_states``). Its buffers
    have ``room`` more positions, so the prompts' rest and the decoded tokens are written in place: each row's states
    are copied once (for 100 rows of 450 positions, a gigabyte)."""
    width = max(length for length, _ in bases) - start
    mask = torch.tensor([[0] * (width - length + start) + [1] * (length - start) for length, _ in bases],
                        dtype=torch.long, device=device)  # fmt: skip
    if not width:
        return growing_cache(), mask
    template = next(states for _, states in bases if states is not None).pieces[0][0].kv
    cache = growing_cache()
    for layer, (keys, _) in enumerate(template):
        heads, _, dims = keys.shape
        # the room is written before anything reads it (the prompts' rest, then each decoded token): states only zeroed
        keys, values = (torch.empty(len(bases), heads, width + room, dims, dtype=keys.dtype, device=device)
                        for _ in range(2))  # fmt: skip
        keys[:, :, :width].zero_(), values[:, :, :width].zero_()
        for row, (length, states) in enumerate(bases):
            if length > start:
                own = width - length + start
                states.write(layer, length, keys[row, :, own:width], values[row, :, own:width], start=start)
        cache.layers.append(GrowingLayer.within(keys, values, width))
    return cache, mask


def shared_states(states: States, length: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The first ``length`` positions of ``states``, each layer's ``[1, heads, length, dims]``, as the attention's
    ``shared_states`` reads them."""
    return {layer: (keys[None], values[None]) for layer, (keys, values) in enumerate(states.layers(length))}


def row_states(cache: DynamicCache, mask: torch.Tensor, row: int, *, start: int = 0) -> KV:
    """Row ``row``'s states of the tokens its mask attends to, in order, unpadded, from the ``start``-th on (a copy)."""
    columns = mask[row].nonzero().squeeze(1)[start:]
    return [(layer.keys[row][:, columns], layer.values[row][:, columns]) for layer in cache.layers]


def select_rows(cache: DynamicCache, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Keep only the ``index`` rows of the cache and return their mask, less the leading columns none of them
    attends to (the left padding of longer rows that left)."""
    cache.batch_select_indices(index)
    mask = mask[index]
    first = int(mask.any(dim=0).int().argmax())
    if first:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    return mask[:, first:]
