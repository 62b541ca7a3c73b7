"""One collective / p2p op as the training thread records it: a plain slotted object.

Its own module so that what completes ops (the recorder, the completion poller) and what turns
them into spans share the type without importing each other.
"""

from __future__ import annotations

from typing import Any

from mycroft.instrumentation.groups import GroupInfo

from mycroft import schema

_IN_FLIGHT = schema.STATE_IN_FLIGHT
_EXACT = schema.TIMING_EXACT
_PYTHON = schema.SOURCE_PYTHON


class OpRecord:
    """One collective / p2p op on this rank. Mutated only until it is queued."""

    __slots__ = (
        "api",
        "async_op",
        "bytes",
        "call_end_ns",
        "device",
        "dst",
        "dtype",
        "end_ns",
        "error",
        "group",
        "key",
        "op",
        "peer",
        "reduce_op",
        "root",
        "seq",
        "source",
        "src",
        "start_ns",
        "state",
        "timing",
    )

    def __init__(self, api: str, op: str, group: GroupInfo, seq: int, start_ns: int, nbytes: int = 0,
                 dtype: Any = None, reduce_op: Any = None, async_op: bool = False) -> None:
        self.api = api
        self.op = op
        self.group = group
        self.seq = seq
        self.start_ns = start_ns
        self.end_ns = 0
        self.call_end_ns = 0  # when the issuing call returned (device-async backends: enqueue)
        self.device = group.device_async  # completes on the device, after the call
        self.bytes = nbytes
        self.dtype = dtype  # torch.dtype, named off the hot path
        self.peer = -1
        self.src = -1
        self.dst = -1
        self.root = -1
        self.reduce_op = reduce_op  # torch ReduceOp / str, named off the hot path
        self.async_op = async_op
        self.state = _IN_FLIGHT
        self.error = ""
        self.timing = _EXACT
        self.source = _PYTHON
        self.key = 0
