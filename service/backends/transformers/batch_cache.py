"""A batch's key-value cache laid out for decoding: one row a sample, left-padded, a 0/1 attention mask beside it.

Positions are the mask's running count, so rows of different lengths share one cache: padding is zeros the mask
hides. These functions build such a cache from single rows' states (a prefix cache's entries), take a row's states
back out, and drop the rows that finished.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from service.backends.transformers.prefix_cache import KV


def left_padded(bases: list[tuple[int, KV | None]], device: torch.device) -> tuple[DynamicCache, torch.Tensor]:
    """A cache with one row per ``(length, states)``, the first ``length`` of ``states`` right-aligned, and its mask."""
    width = max(length for length, _ in bases)
    mask = torch.tensor([[0] * (width - length) + [1] * length for length, _ in bases], dtype=torch.long, device=device)
    if not width:
        return DynamicCache(), mask
    template = next(kv for _, kv in bases if kv is not None)
    layers = []
    for layer, (keys, _) in enumerate(template):
        heads, _, dims = keys.shape
        keys, values = (torch.zeros(len(bases), heads, width, dims, dtype=keys.dtype, device=device) for _ in range(2))
        for row, (length, kv) in enumerate(bases):
            if length:
                keys[row, :, width - length :], values[row, :, width - length :] = (t[:, :length] for t in kv[layer])
        layers.append((keys, values))
    return DynamicCache(layers), mask


def row_states(cache: DynamicCache, mask: torch.Tensor, row: int) -> KV:
    """Row ``row``'s states of the tokens its mask attends to, in order, unpadded."""
    columns = mask[row].bool()
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
