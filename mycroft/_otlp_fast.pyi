"""Type stub of the compiled OTLP decoder (mycroft/_otlp_fast.c)."""

from collections.abc import Callable
from typing import Any

def decode(payload: bytes, values: dict[bytes, tuple[str, Any]], volatile_keys: frozenset[str], max_entries: int,
           miss: Callable[[bytes], tuple[str, Any]], resource_bytes: Callable[[bytes], dict[str, Any]],
           record_type: type, max_attributes: int) -> tuple[list[Any], int] | None: ...
