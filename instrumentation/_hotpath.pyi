"""Type stub of the compiled hot path (instrumentation/_hotpath.c)."""

from collections.abc import Callable
from typing import Any

def configure(op_record_type: type, group_info_type: type, depth_type: type,
              payload_info: Callable[[Any], tuple[int, Any]], state_completed: str, state_in_flight: str) -> None:
    """All or nothing: a call that raises changes nothing."""

class Counters:
    """A recorder's per-op counters as C integers (recorder.Counters where the extension is built)."""
    last_activity_ns: int
    comm_ns: int
    comm_since_ns: int
    ops_done: int

class Ring:
    """The compiled hot path's sync ops in fixed slots (Recorder.ring); the runtime makes their OpRecords.
    Read-only counts, this process's: in a forked child the ring forgets the parent's slots at its first use."""
    in_flight: int
    taken: int
    full: int
    lost: int
    def __init__(self, capacity: int) -> None: ...
    def __len__(self) -> int: ...
    def drain(self) -> list[Any]: ...
    def inflight(self) -> list[Any]: ...
    def done(self) -> list[Any]: ...

class Hot:
    def __init__(self, slow: Callable[..., Any], original: Callable[..., Any], recorder: Any, api: str, op: str,
                 group: tuple[int, str], payload: tuple[int, str], reduce_op: tuple[int, str],
                 async_op: tuple[int, str], root: Callable[..., None] | None, issues_many: bool,
                 compiler: Any = None) -> None: ...
    def counts(self) -> tuple[int, int]: ...

class Door:
    """What a door function is bound to (its __self__): its Hot, or None while torch's function takes the calls."""
    hot: Hot | None
    @property
    def original(self) -> Callable[..., Any]: ...

def door(original: Callable[..., Any], name: str, module: str, doc: str | None = None) -> Callable[..., Any]: ...

class Wait:
    """torch's Work.wait with `waiters` one longer while a thread is inside it; binds as a method."""
    def __init__(self, original: Callable[..., Any], waiters: Any) -> None: ...
    def __call__(self, work: Any, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, work: Any, owner: type | None = None) -> Callable[..., Any]: ...
