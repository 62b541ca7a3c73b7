"""Type stub of the compiled heartbeat fold (rca_service/ingest/_fold_fast.c)."""

from collections.abc import Callable, Iterator
from typing import Any

def configure(keys: tuple[str, ...], flow_keys: tuple[str, ...], op_send: str, inflight_type: type,
              seq_record_type: type, run_keys: tuple[str, ...]) -> None: ...
def fold(job: Any, rank: Any, attributes: dict[str, Any], received_at: float, end_ns: int, max_stack_chars: int,
         max_seqs_per_group: int) -> int: ...
def fold_run(records: Iterator[Any], job: Any, facts: tuple[str, str, int], facts_memo: dict[int, Any],
             received_at: float, max_stack_chars: int, max_seqs_per_group: int, python_fold: Callable[..., None],
             fold_digests: Callable[..., None], cfg: Any) -> tuple[int, Any]: ...
