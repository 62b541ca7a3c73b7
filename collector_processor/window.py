"""Bounded windows: per-key state that closes at a deadline, and a bounded LRU map.

The processor joins spans that arrive over seconds from many ranks, so it must hold
state; these two structures are the only places it does, and both have a hard size.
Time is always passed in (`now`), never read here, so the core stays a pure,
deterministic function of its inputs and tests need no sleeping.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Windows(Generic[K, V]):
    """Open entries keyed by K, each with a deadline; at most `capacity` at once.

    `open()` returns the entry and any entry evicted to make room (oldest first);
    `due(now)` pops every entry whose deadline has passed, earliest deadline first.
    A deadline can move (e.g. a collective that completes closes sooner); stale heap
    items are skipped lazily and the heap is compacted when it grows past the entries.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        item = self._entries.get(key)
        return None if item is None else item[1]

    def open(self, key: K, deadline: float, factory: Callable[[], V]) -> tuple[V, list[tuple[K, V]]]:
        """The entry for `key`, created with `deadline` if new; plus entries evicted for room."""
        item = self._entries.get(key)
        if item is not None:
            return item[1], []
        evicted: list[tuple[K, V]] = []
        while len(self._entries) >= self.capacity:
            old_key, (_, old_value) = self._entries.popitem(last=False)
            evicted.append((old_key, old_value))
        value = factory()
        self._entries[key] = (deadline, value)
        self._push(deadline, key)
        return value, evicted

    def set_deadline(self, key: K, deadline: float) -> None:
        item = self._entries.get(key)
        if item is None or item[0] == deadline:
            return
        self._entries[key] = (deadline, item[1])
        self._push(deadline, key)

    def deadline(self, key: K) -> float | None:
        item = self._entries.get(key)
        return None if item is None else item[0]

    def due(self, now: float) -> list[tuple[K, V]]:
        closed: list[tuple[K, V]] = []
        while self._heap and self._heap[0][0] <= now:
            deadline, _, key = heapq.heappop(self._heap)
            item = self._entries.get(key)
            if item is not None and item[0] == deadline:
                del self._entries[key]
                closed.append((key, item[1]))
        return closed

    def next_deadline(self) -> float | None:
        """Earliest live deadline (drops stale heap heads on the way)."""
        while self._heap:
            deadline, _, key = self._heap[0]
            item = self._entries.get(key)
            if item is not None and item[0] == deadline:
                return deadline
            heapq.heappop(self._heap)
        return None

    def drain(self) -> list[tuple[K, V]]:
        """Every open entry, oldest first (shutdown)."""
        items = [(key, value) for key, (_, value) in self._entries.items()]
        self._entries.clear()
        self._heap.clear()
        return items

    def values(self) -> Iterator[V]:
        return (value for _, value in self._entries.values())

    def _push(self, deadline: float, key: K) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, key))
        if len(self._heap) > 4 * len(self._entries) + 64:
            self._heap = [(d, s, k) for d, s, k in self._heap
                          if k in self._entries and self._entries[k][0] == d]
            heapq.heapify(self._heap)


class BoundedLru(Generic[K, V]):
    """A dict that forgets its least recently used keys beyond `capacity`."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)
