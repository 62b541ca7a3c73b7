"""Signature digests of completed collectives, per group and block of seqs (schema.ATTR_HB_DIGEST_*).

With op spans sampled (the telemetry diet) the RCA no longer sees every op's signature, so a
mismatch that completes (same size, different dtype: garbage, no error) would go unseen.
Each rank sums a hash of every collective's (seq, op, bytes, dtype) per block of
schema.DIGEST_BLOCK seqs and puts closed blocks in its next heartbeats: a few integers per
group per block. Fed from the background thread's drain, never from the training thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from mycroft import schema

MAX_OPEN_BLOCKS = 4  # per group: a block that never closes (an op lost) gives way


class SignatureDigests:
    def __init__(self) -> None:
        self._open: dict[str, dict[int, list[int]]] = {}  # group id -> block -> [ops seen, sum]
        self._closed: deque[list[Any]] = deque(maxlen=256)  # [group id, block, digest, heartbeats left]

    def add(self, group_id: str, seq: int, op: str, nbytes: int, dtype: str) -> None:
        """One collective of this rank (any final state: its signature is what counts)."""
        if seq <= 0:
            return
        block = schema.digest_block(seq)
        blocks = self._open.get(group_id)
        if blocks is None:  # (setdefault would build a dict per op)
            blocks = self._open[group_id] = {}
        acc = blocks.get(block)
        if acc is None:
            if len(blocks) >= MAX_OPEN_BLOCKS:
                del blocks[min(blocks)]
            acc = blocks[block] = [0, 0]
        acc[0] += 1
        acc[1] = (acc[1] + schema.signature_hash(seq, op, nbytes, dtype)) & 0xFFFFFFFF
        if acc[0] == schema.DIGEST_BLOCK:
            del blocks[block]
            self._closed.append([group_id, block, acc[1], schema.DIGEST_REPEATS])

    def heartbeat_attributes(self) -> dict[str, list[Any]]:
        """Closed blocks not yet sent DIGEST_REPEATS times (empty: nothing to say)."""
        if not self._closed:
            return {}
        gids, blocks, values = [], [], []
        for entry in self._closed:
            gids.append(entry[0])
            blocks.append(entry[1])
            values.append(entry[2])
            entry[3] -= 1
        while self._closed and self._closed[0][3] <= 0:
            self._closed.popleft()
        return {schema.ATTR_HB_DIGEST_GROUP_IDS: gids, schema.ATTR_HB_DIGEST_BLOCKS: blocks,
                schema.ATTR_HB_DIGEST_VALUES: values}
