"""The key and value states of token sequences already encoded, so that a prompt starting with one is encoded only
from where it ends: an agent's next turn is its last prompt, its last reply and a tool's answer, and on a CPU
encoding the whole conversation again at every turn is most of a turn's cost (vLLM's automatic prefix caching gives
ART the same on a GPU).

States are stored once however many entries start with them, as vLLM shares its cache blocks: an entry is a chain of
segments, the states of the longest prefix another entry already held, then its own new positions. A batch of 2048
games or email episodes shares one opening (a system prompt, tools, few-shot turns: 223 and 831 tokens), and each
turn extends the game's last entry: stored whole, 100 games' openings alone filled the old 512 MiB bound, the batch's
entries evicted one another in turn and every game was encoded from its first token at every turn.

Entries are kept least recently used first and bounded in bytes, each segment counted once: SmolLM2-135M's states take
30 layers x 2 (keys, values) x 3 key-value heads x 64 dims x 2 bytes = 22.5 KiB a token in bf16 (twice that in float32),
so ``MAX_BYTES`` holds about 93,000 tokens of it: 100 games of 2048 to its 16 tile after their opening, or 64 email
episodes of 1,400 tokens. Memory is taken only as conversations come; a math job's batch holds a few MB. The engine
frees it when a training step begins. States are only valid for the weights that computed them: :meth:`PrefixCache.use`
forgets them all when the weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

MAX_BYTES = 2 << 30
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


class Segment:
    """The states of consecutive positions, shared by every entry that starts with them."""

    __slots__ = ("kv", "length", "nbytes")

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.length = kv[0][0].shape[1]
        self.nbytes = sum(keys.nbytes + values.nbytes for keys, values in kv)


class States:
    """A token sequence's states as a chain of (segment, how many of its first positions) pieces."""

    __slots__ = ("pieces", "length")

    def __init__(self, pieces: tuple[tuple[Segment, int], ...]) -> None:
        self.pieces = pieces
        self.length = sum(used for _, used in pieces)

    @classmethod
    def of(cls, kv: KV) -> States:
        """States held in one new segment."""
        segment = Segment(kv)
        return cls(((segment, segment.length),))

    def first(self, length: int) -> States:
        """The states of the first ``length`` positions (no copy)."""
        pieces, left = [], length
        for segment, used in self.pieces:
            if left <= 0:
                break
            pieces.append((segment, min(used, left)))
            left -= used
        return States(tuple(pieces))

    def write(self, layer: int, length: int, keys: torch.Tensor, values: torch.Tensor, *, start: int = 0) -> None:
        """Copy layer ``layer``'s states of positions ``start`` to ``length`` into ``keys`` and ``values``
        ([heads, length - start, head_dim] each)."""
        at = -start
        for segment, used in self.first(length).pieces:
            skip = max(0, -at)
            if skip < used:
                source_keys, source_values = segment.kv[layer]
                to = at + skip
                keys[:, to : at + used], values[:, to : at + used] = (source_keys[:, skip:used],
                                                                      source_values[:, skip:used])  # fmt: skip
            at += used

    def layers(self, length: int) -> KV:
        """Every layer's states of the first ``length`` positions, contiguous (a copy where there are several
        pieces)."""
        pieces = self.first(length).pieces
        if len(pieces) == 1:
            segment, used = pieces[0]
            return [(keys[:, :used], values[:, :used]) for keys, values in segment.kv]
        return [tuple(torch.cat([segment.kv[layer][part][:, :used] for segment, used in pieces], dim=1)
                      for part in (0, 1)) for layer in range(len(pieces[0][0].kv))]  # fmt: skip


class PrefixCache:
    """An LRU of token sequences' states, at most ``max_bytes`` of segments (0: nothing is kept)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], States] = OrderedDict()
        self._references: dict[Segment, int] = {}  # each segment held, with how many entries hold it
        self._bytes = 0
        self._weights: Hashable = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The bytes of the segments held, each counted once."""
        return self._bytes

    def use(self, weights: Hashable) -> None:
        """What follows is computed with ``weights`` (an identity of them): states of any other are forgotten."""
        if weights != self._weights:
            self._entries.clear()
            self._references.clear()
            self._bytes, self._weights = 0, weights

    def longest(self, ids: tuple[int, ...], limit: int) -> tuple[int, States | None]:
        """The most of ``ids``' first tokens (at most ``limit``) an entry holds the states of, and that entry's states
        (longer than that, perhaps; only its first ones are ``ids``'); (0, None) if none."""
        best, found, limit = 0, None, min(limit, len(ids))
        for key in self._entries:
            if best >= limit:
                break
            # only an entry that shares more than the best so far is measured: a token and a slice comparison rule
            # out the rest (most, where the rows are many conversations after one opening), where measuring took ten
            if len(key) > best and key[best] == ids[best] and key[:best] == ids[:best]:
                best, found = _shared(key, ids, limit), key
        if found is None:
            return 0, None
        self._entries.move_to_end(found)
        return best, self._entries[found]

    def put(self, ids: tuple[int, ...], states_from: Callable[[int], KV]) -> None:
        """Keep the states of ``ids`` in place of entries it extends: those of the longest prefix an entry holds are
        shared with it, and ``states_from(start)`` gives the rest (of positions ``start`` on). The least recently used
        go until the rest fits; new states larger than the whole bound are not kept."""
        if not ids or not self.enabled:
            return
        start, held = self.longest(ids, len(ids))
        if start == len(ids):
            return
        pieces = held.first(start).pieces if held is not None else ()
        new = Segment(states_from(start))
        if new.nbytes > self.max_bytes:
            return
        states = States((*pieces, (new, new.length)))
        for segment, _ in states.pieces:  # held before the entries it extends go: their segments stay counted
            self._hold(segment)
        for key in [k for k in self._entries if len(k) <= start and ids[: len(k)] == k]:  # none is longer than start
            self._drop(key)
        self._entries[ids] = states
        while self._entries and (self._bytes > self.max_bytes or len(self._entries) > MAX_ENTRIES):
            self._drop(next(iter(self._entries)))

    def _hold(self, segment: Segment) -> None:
        self._references[segment] = self._references.get(segment, 0) + 1
        if self._references[segment] == 1:
            self._bytes += segment.nbytes

    def _drop(self, key: tuple[int, ...]) -> None:
        for segment, _ in self._entries.pop(key).pieces:
            self._references[segment] -= 1
            if not self._references[segment]:
                del self._references[segment]
                self._bytes -= segment.nbytes
