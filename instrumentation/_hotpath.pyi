"""Type stub of the compiled hot path (instrumentation/_hotpath.c)."""

from collections.abc import Callable
from typing import Any

def configure(op_record_type: type, group_info_type: type, payload_info: Callable[[Any], tuple[int, Any]],
              state_completed: str, state_in_flight: str) -> None: ...

class Hot:
    def __init__(self, slow: Callable[..., Any], original: Callable[..., Any], recorder: Any, api: str, op: str,
                 group: tuple[int, str], payload: tuple[int, str], reduce_op: tuple[int, str],
                 async_op: tuple[int, str], root: Callable[..., None] | None, issues_many: bool) -> None: ...
    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any: ...
    def counts(self) -> tuple[int, int]: ...
