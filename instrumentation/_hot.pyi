"""Type stub of the compiled begin / complete (instrumentation/_hot.c)."""

from collections.abc import Callable
from typing import Any

def configure(record_type: type, in_flight: str, completed: str, exact: str, python: str,
              p2p_ops: frozenset[str]) -> None: ...

class Beginner:
    def __init__(self, recorder: Any, api: str, op: str, where: str, g_pos: int, g_key: str, p_pos: int,
                 p_key: str, has_payload: bool, r_key: str, r_pos: int, a_key: str, a_pos: int,
                 always_async: bool, track: bool, payload_info: Callable[[Any], tuple[int, Any]],
                 root_field: Callable[..., None] | None) -> None: ...
    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None, group: Any = None) -> Any: ...

class Completer:
    def __init__(self, recorder: Any, fallback: Callable[..., None]) -> None: ...
    def __call__(self, record: Any, state: str = ..., timing: str = ...) -> None: ...
