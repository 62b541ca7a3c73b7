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
    """One collective / p2p op on this rank. Mutated only until it is queued.

    Built once per op on the training thread, so built cheaply: the fields every op sets are
    slots, written by __init__; the fields only some ops set (p2p peers, a root, an error, a
    non-exact timing, an async op's call end) are class-level defaults, and setting one gives
    that record its own value (in a `__dict__` made only then). Reads are the same either way.
    A record with all 21 fields written in __init__ cost ~1.1 us next to a gloo all_reduce, one
    with the 12 per-op ones ~0.7 us.
    """

    __slots__ = (
        "__dict__",
        "api",
        "async_op",
        "bytes",
        "device",
        "dtype",
        "end_ns",
        "group",
        "op",
        "reduce_op",
        "seq",
        "start_ns",
        "state",
    )

    call_end_ns: int = 0  # when the issuing call returned (device-async backends: enqueue)
    peer: int = -1
    src: int = -1
    dst: int = -1
    root: int = -1
    error: str = ""
    timing: str = _EXACT
    source: str = _PYTHON
    key: int = 0  # p2p: torch's counter before the op (how far the op moved it)

    def __init__(self, api: str, op: str, group: GroupInfo, seq: int, start_ns: int, nbytes: int = 0,
                 dtype: Any = None, reduce_op: Any = None, async_op: bool = False) -> None:
        self.api = api
        self.op = op
        self.group = group
        self.seq = seq
        self.start_ns = start_ns
        self.end_ns = 0
        self.device = group.device_async  # completes on the device, after the call
        self.bytes = nbytes
        self.dtype = dtype  # torch.dtype, named off the hot path
        self.reduce_op = reduce_op  # torch ReduceOp / str, named off the hot path
        self.async_op = async_op
        self.state = _IN_FLIGHT
