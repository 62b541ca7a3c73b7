"""Type stub of the compiled OTLP decoder (mycroft/_otlp_fast.c)."""

from collections.abc import Callable
from typing import Any

class Memo:
    def __init__(self, max_entries: int = 131072) -> None: ...
    def __len__(self) -> int: ...
    def clear(self) -> None: ...

def decode(payload: bytes, memo: Memo, volatile_keys: frozenset[str],
           miss: Callable[[bytes], tuple[str, Any]], resource_bytes: Callable[[bytes], dict[str, Any]],
           record_type: type, max_attributes: int, resources: Memo,
           template_name: str | None = None) -> tuple[list[Any], int] | None: ...

def attributes(attributes: dict[str, Any], pieces: dict[Any, Any], cached: Callable[[Any], bytes],
               uncached: Callable[[Any], bytes], cached_ints: int, cache_max: int) -> bytes: ...
