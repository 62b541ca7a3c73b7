"""What may enter the live state: bounds checked before anything is expanded, and run identity.

Pure. `apply_records` (state.py) asks `reject_reason` about every record before folding
it, and `job_key` which JobState it belongs to:

- a rank must lie inside its world (a heartbeat claiming rank 5 of world 4 would
  otherwise become a silent rank and a false crash), p2p peers too;
- group member lists are checked against the world size on their range ends, so a
  9-byte "0-999999999" is refused instead of expanded to a billion ints;
- parallel arrays of a heartbeat are capped;
- two launches under one job id (a clash, or a relaunch) never share state: a record
  of another run (mycroft.run.id, or a different world size for senders without one)
  gets its own JobState "JOB#RUN" while the first run is alive; a relaunch (same run
  base, a newer torchelastic restart) or a run that went quiet is replaced.
"""

from __future__ import annotations

import functools
from typing import Any

from mycroft import schema
from mycroft.auth import RUN_SEPARATOR
from mycroft.otlp import SpanRecord

from .config import AnalysisConfig

REJECT_RANK_OUT_OF_WORLD = "rank_out_of_world"
REJECT_BAD_WORLD_SIZE = "bad_world_size"
REJECT_BAD_GROUP_RANKS = "bad_group_ranks"
REJECT_PEER_OUT_OF_WORLD = "peer_out_of_world"
REJECT_OVERSIZED = "oversized_arrays"
REASONS = (REJECT_RANK_OUT_OF_WORLD, REJECT_BAD_WORLD_SIZE, REJECT_BAD_GROUP_RANKS, REJECT_PEER_OUT_OF_WORLD,
           REJECT_OVERSIZED)

MAX_INFLIGHT_OPS = 4096  # per heartbeat
QUIET_INTERVALS = 3.0  # a run silent this many heartbeat intervals has ended: a new run may replace it

_HB_GROUP_ARRAYS = (schema.ATTR_HB_GROUP_IDS, schema.ATTR_HB_GROUP_NAMES, schema.ATTR_HB_GROUP_SIZES,
                    schema.ATTR_HB_GROUP_RANKS, schema.ATTR_HB_GROUP_ISSUED, schema.ATTR_HB_GROUP_COMPLETED)
_HB_INFLIGHT_ARRAYS = (schema.ATTR_HB_INFLIGHT_GROUP_IDS, schema.ATTR_HB_INFLIGHT_SEQS, schema.ATTR_HB_INFLIGHT_OPS,
                       schema.ATTR_HB_INFLIGHT_AGES_S, schema.ATTR_HB_INFLIGHT_PEERS, schema.ATTR_HB_INFLIGHT_BYTES,
                       schema.ATTR_HB_INFLIGHT_DTYPES)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def world_of(record: SpanRecord) -> int:
    return _int(record.resource.get(schema.RES_WORLD_SIZE), 0)


def _bad_ranks(text: Any, limit: int, cfg: AnalysisConfig) -> bool:
    if not isinstance(text, str) or not text:
        return False
    return _bad_ranks_text(text, limit, cfg.max_ranks_per_job)


@functools.lru_cache(maxsize=1 << 16)
def _bad_ranks_text(text: str, limit: int, max_ranks: int) -> bool:
    """Memoized: every heartbeat of every rank repeats its groups' member strings."""
    try:
        schema.count_ranks(text, limit, max_ranks)
    except ValueError:
        return True
    return False


_MEMBER_LISTS: dict[int, tuple[list[Any], int, int, bool]] = {}  # id -> (the list, limit, max ranks, bad)


def _bad_member_lists(members: list[Any], limit: int, cfg: AnalysisConfig) -> bool:
    """Whether any group member string of a heartbeat is malformed or outside the world.

    Memoized by the list's identity: the OTLP decoder shares one list among every heartbeat
    that carried the same bytes (a rank's table repeats every beat); the entry holds the
    list, so its id cannot be reused while it is remembered.
    """
    found = _MEMBER_LISTS.get(id(members))
    if found is not None and found[0] is members and found[1] == limit and found[2] == cfg.max_ranks_per_job:
        return found[3]
    bad = any(_bad_ranks(text, limit, cfg) for text in members)
    if len(_MEMBER_LISTS) >= 1 << 16:
        _MEMBER_LISTS.clear()
    _MEMBER_LISTS[id(members)] = (members, limit, cfg.max_ranks_per_job, bad)
    return bad


def _peer_bad(value: Any, limit: int) -> bool:
    peer = _int(value, -1)
    return peer >= limit or peer < -1


def _oversized_heartbeat(a: dict[str, Any], cfg: AnalysisConfig) -> str | None:
    for key in _HB_GROUP_ARRAYS:
        value = a.get(key)
        if isinstance(value, list) and len(value) > cfg.max_groups_per_job:
            return REJECT_OVERSIZED
    for key in _HB_INFLIGHT_ARRAYS:
        value = a.get(key)
        if isinstance(value, list) and len(value) > MAX_INFLIGHT_OPS:
            return REJECT_OVERSIZED
    return None


def reject_reason(record: SpanRecord, rank: int, cfg: AnalysisConfig) -> str | None:
    """Why this record (of `rank`) must not enter the state, or None."""
    world = world_of(record)
    if world < 0 or world > cfg.max_ranks_per_job:
        return REJECT_BAD_WORLD_SIZE
    limit = world or cfg.max_ranks_per_job
    if rank >= limit:
        return REJECT_RANK_OUT_OF_WORLD
    a = record.attributes
    kind = record.kind
    if kind == schema.KIND_HEARTBEAT:
        # one pass over the values: when no array is longer than the smaller cap, none is oversized
        cap = min(cfg.max_groups_per_job, MAX_INFLIGHT_OPS)
        if any(len(v) > cap for v in a.values() if type(v) is list):
            oversized = _oversized_heartbeat(a, cfg)
            if oversized:
                return oversized
        members = a.get(schema.ATTR_HB_GROUP_RANKS)
        if isinstance(members, list) and _bad_member_lists(members, limit, cfg):
            return REJECT_BAD_GROUP_RANKS
        peers = a.get(schema.ATTR_HB_INFLIGHT_PEERS)
        if isinstance(peers, list) and peers and any(_peer_bad(p, limit) for p in peers):
            return REJECT_PEER_OUT_OF_WORLD
    elif kind == schema.KIND_COLLECTIVE:
        if _bad_ranks(a.get(schema.ATTR_GROUP_RANKS), limit, cfg):
            return REJECT_BAD_GROUP_RANKS
    elif kind == schema.KIND_P2P:
        for key in (schema.ATTR_P2P_SRC, schema.ATTR_P2P_DST, schema.ATTR_PEER):
            if key in a and _peer_bad(a.get(key), limit):
                return REJECT_PEER_OUT_OF_WORLD
    return None


def run_of(record: SpanRecord) -> str:
    value = record.resource.get(schema.RES_RUN_ID)
    return str(value)[:128] if value is not None else ""


def _base_and_restart(run: str) -> tuple[str, int | None]:
    base, dot, restart = run.rpartition(".")
    if dot and restart.isdigit():
        return base, int(restart)
    return run, None


def same_run(run_a: str, world_a: int, run_b: str, world_b: int) -> bool:
    """Could two records' launches be one run? Unknown (empty / 0) matches anything."""
    if run_a and run_b and run_a != run_b:
        return False
    return not (world_a and world_b and world_a != world_b)


def is_relaunch(old_run: str, new_run: str) -> bool:
    """The same launch base restarted by torchelastic (base.N -> base.M, M > N)."""
    old_base, old_restart = _base_and_restart(old_run)
    new_base, new_restart = _base_and_restart(new_run)
    return (old_restart is not None and new_restart is not None and old_base == new_base
            and new_restart > old_restart)


def job_key(job_id: str, run: str, world: int) -> str:
    """The key of a second, concurrent run of `job_id`."""
    return f"{job_id}{RUN_SEPARATOR}{run or f'world{world}'}"[:256]
