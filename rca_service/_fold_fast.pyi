"""Type stub of the compiled heartbeat fold (rca_service/_fold_fast.c)."""

from typing import Any

def configure(keys: tuple[str, ...], flow_keys: tuple[str, ...], op_send: str, inflight_type: type,
              seq_record_type: type) -> None: ...
def fold(job: Any, rank: Any, attributes: dict[str, Any], received_at: float, end_ns: int, max_stack_chars: int,
         max_seqs_per_group: int) -> int: ...
