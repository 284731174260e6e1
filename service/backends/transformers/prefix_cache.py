"""The key and value states of token sequences already encoded, so that a prompt starting with one is encoded only
from where it ends: an agent's next turn is its last prompt, its last reply and a tool's answer, and on a CPU
encoding the whole conversation again at every turn is most of a turn's cost (vLLM's automatic prefix caching gives
ART the same on a GPU).

Entries are kept least recently used first and bounded in bytes: SmolLM2-135M's states take 30 layers x 2 (keys,
values) x 3 key-value heads x 64 dims x 4 bytes = 45 KiB a token in float32, so ``MAX_BYTES`` holds about 11,600
tokens of it, eight email-agent conversations of 1,400 tokens; small beside sampling's own cache and the model, so the
main job's peak stays under 3 GiB. The engine frees it when a training step begins. States are only valid for
the weights that computed them: :meth:`PrefixCache.use` forgets them all when the weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch

MAX_BYTES = 512 << 20
# Entries at most: a lookup compares the prompt with each, so many tiny entries (a client's short prompts) would make
# every request's lookup slow however few bytes they hold.
MAX_ENTRIES = 256

KV = list[tuple[torch.Tensor, torch.Tensor]]  # a layer's keys and values, each [heads, tokens, head_dim]


def _shared(a: tuple[int, ...], b: tuple[int, ...], limit: int) -> int:
    """How many tokens ``a`` and ``b`` start with alike, at most ``limit`` (a binary search of C-speed slice
    comparisons: conversations are thousands of tokens long)."""
    high = min(len(a), len(b), limit)
    if a[:high] == b[:high]:
        return high
    low = 0  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if a[:middle] == b[:middle] else (low, middle)
    return low


def _nbytes(kv: KV) -> int:
    return sum(keys.nbytes + values.nbytes for keys, values in kv)


class PrefixCache:
    """An LRU of token sequences' states, at most ``max_bytes`` of them (0: nothing is kept)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._bytes = 0
        self._weights: Hashable = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def use(self, weights: Hashable) -> None:
        """What follows is computed with ``weights`` (an identity of them): states of any other are forgotten."""
        if weights != self._weights:
            self._entries.clear()
            self._bytes, self._weights = 0, weights

    def longest(self, ids: tuple[int, ...], limit: int) -> tuple[int, KV | None]:
        """The most of ``ids``' first tokens (at most ``limit``) an entry holds the states of, and that entry's states
        (longer than that, perhaps; only its first ones are ``ids``'); (0, None) if none."""
        best, found = 0, None
        for key in self._entries if limit > 0 else ():
            if key[0] == ids[0] and (length := _shared(key, ids, limit)) > best:
                best, found = length, key
        if found is None:
            return 0, None
        self._entries.move_to_end(found)
        return best, self._entries[found]

    def put(self, ids: tuple[int, ...], kv: KV) -> None:
        """Keep ``kv``, the states of ``ids``, in place of entries it extends; the least recently used go until the
        rest fits. One larger than the whole bound is not kept."""
        size = _nbytes(kv)
        if not ids or size > self.max_bytes:
            return
        for key in [k for k in self._entries if len(k) <= len(ids) and ids[: len(k)] == k]:
            self._bytes -= _nbytes(self._entries.pop(key))
        self._entries[ids] = kv
        self._bytes += size
        while self._bytes > self.max_bytes or len(self._entries) > MAX_ENTRIES:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= _nbytes(evicted)
