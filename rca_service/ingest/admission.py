"""What may enter the live state: bounds checked before anything is expanded, and run identity.

Pure. `apply_records` (state.py) asks `reject_reason` about every record before folding
it, and `job_key` which JobState it belongs to:

- a rank must lie inside its world (a heartbeat claiming rank 5 of world 4 would
  otherwise become a silent rank and a false crash), p2p peers too;
- group member lists are checked against the world size on their range ends, so a
  9-byte "0-999999999" is refused instead of expanded to a billion ints;
- a heartbeat's arrays that drive work or state are capped: the leading array of each table
  (group ids, in-flight group ids, digest group ids; the fold reads the parallel arrays only
  at the leading one's indices, so their extra elements are never read) and the two lists
  admission itself walks (member strings, in-flight peers);
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

from ..config import AnalysisConfig

REJECT_RANK_OUT_OF_WORLD = "rank_out_of_world"
REJECT_BAD_WORLD_SIZE = "bad_world_size"
REJECT_BAD_GROUP_RANKS = "bad_group_ranks"
REJECT_PEER_OUT_OF_WORLD = "peer_out_of_world"
REJECT_OVERSIZED = "oversized_arrays"
REJECT_BAD_AGENT = "bad_agent"  # an agent span without host / pid, or node counts out of bounds
REASONS = (REJECT_RANK_OUT_OF_WORLD, REJECT_BAD_WORLD_SIZE, REJECT_BAD_GROUP_RANKS, REJECT_PEER_OUT_OF_WORLD,
           REJECT_OVERSIZED, REJECT_BAD_AGENT)

MAX_INFLIGHT_OPS = 4096  # per heartbeat
QUIET_INTERVALS = 3.0  # a run silent this many heartbeat intervals has ended: a new run may replace it

def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def world_of(record: SpanRecord) -> int:
    return resource_facts(record.resource)[2]


Facts = tuple[str, str, int]  # (job id, run id, world size)

#: id(resource) -> (the resource, its facts)
RESOURCE_FACTS: dict[int, tuple[dict[str, Any], Facts]] = {}
#: one tuple per distinct facts: every process of a job shares it, so its identity keys a memo
_INTERNED_FACTS: dict[Facts, Facts] = {}


def resource_facts(resource: dict[str, Any]) -> Facts:
    """(job id, run id, world size) a resource names: what every record of a process repeats.

    Memoized by the dict's identity: the decoders share one dict per distinct resource (every
    span of a process), and the entry holds it, so its id cannot be reused while remembered.
    Callers treat resources as read-only (as the decoders' shared values). Equal facts are one
    tuple (interned): a job's 16k processes give the same object, which `apply_records` uses to
    look the job up once per batch.
    """
    found = RESOURCE_FACTS.get(id(resource))
    if found is not None and found[0] is resource:
        return found[1]
    job = resource.get(schema.RES_JOB_ID)
    if job is None:
        job = resource.get(schema.RES_SERVICE_NAME, "unknown")
    run = resource.get(schema.RES_RUN_ID)
    facts: Facts = (str(job), str(run)[:128] if run is not None else "", _int(resource.get(schema.RES_WORLD_SIZE), 0))
    if len(RESOURCE_FACTS) >= 1 << 16:
        RESOURCE_FACTS.clear()
    if len(_INTERNED_FACTS) >= 1 << 12:
        _INTERNED_FACTS.clear()
    facts = _INTERNED_FACTS.setdefault(facts, facts)
    RESOURCE_FACTS[id(resource)] = (resource, facts)
    return facts


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


#: per kind of list ("members", "peers"): id(list) -> (the list, limit, max ranks, bad)
_LIST_VERDICTS: dict[str, dict[int, tuple[list[Any], int, int, bool]]] = {"members": {}, "peers": {}}


def _bad_list(what: str, values: list[Any], limit: int, cfg: AnalysisConfig) -> bool:
    """Whether a heartbeat's group member strings (`what` "members") or in-flight peers ("peers")
    are malformed or outside the world.

    Memoized by the list's identity: the OTLP decoder shares one list among every heartbeat
    that carried the same bytes (a rank's table repeats every beat); the entry holds the
    list, so its id cannot be reused while it is remembered.
    """
    verdicts = _LIST_VERDICTS[what]
    found = verdicts.get(id(values))
    if found is not None and found[0] is values and found[1] == limit and found[2] == cfg.max_ranks_per_job:
        return found[3]
    if what == "members":
        bad = any(_bad_ranks(text, limit, cfg) for text in values)
    else:
        bad = any(_peer_bad(peer, limit) for peer in values)
    if len(verdicts) >= 1 << 16:
        verdicts.clear()
    verdicts[id(values)] = (values, limit, cfg.max_ranks_per_job, bad)
    return bad


def _peer_bad(value: Any, limit: int) -> bool:
    peer = _int(value, -1)
    return peer >= limit or peer < -1


def _oversized(value: Any, cap: int) -> bool:
    return value.__class__ is list and len(value) > cap


#: what admission reads of a heartbeat: the leading arrays of its tables and the lists it walks
HEARTBEAT_CHECKED = (schema.ATTR_HB_GROUP_IDS, schema.ATTR_HB_GROUP_RANKS, schema.ATTR_HB_DIGEST_GROUP_IDS,
                     schema.ATTR_HB_INFLIGHT_GROUP_IDS, schema.ATTR_HB_INFLIGHT_PEERS)


def heartbeat_checked(attributes: dict[str, Any]) -> tuple[Any, ...]:
    """The values of HEARTBEAT_CHECKED: a heartbeat whose are equal to those of an admitted one of
    the same process (same resource: same world) is admitted too (the decoder hands a process's
    repeated values over as the same objects, so the comparison is one identity test each)."""
    return tuple(map(attributes.get, HEARTBEAT_CHECKED))


def _heartbeat_reason(a: dict[str, Any], limit: int, cfg: AnalysisConfig,
                      admitted: tuple[Any, ...] | None) -> str | None:
    ids, members, digest_ids, inflight_ids, peers = heartbeat_checked(a)
    groups_cap = cfg.max_groups_per_job
    if _oversized(ids, groups_cap) or _oversized(members, groups_cap) or _oversized(digest_ids, groups_cap) \
            or _oversized(inflight_ids, MAX_INFLIGHT_OPS) or _oversized(peers, MAX_INFLIGHT_OPS):
        return REJECT_OVERSIZED
    admitted_members = admitted[1] if admitted is not None else None
    if members.__class__ is list and members is not admitted_members and _bad_list("members", members, limit, cfg):
        return REJECT_BAD_GROUP_RANKS
    if peers.__class__ is list and peers and _bad_list("peers", peers, limit, cfg):
        return REJECT_PEER_OUT_OF_WORLD
    return None


def reject_reason(record: SpanRecord, rank: int, cfg: AnalysisConfig, world: int | None = None,
                  admitted: tuple[Any, ...] | None = None) -> str | None:
    """Why this record (of `rank`; `world`: its resource's world size where the caller has it) must
    not enter the state, or None. `admitted`: heartbeat_checked() of an earlier heartbeat of the
    same process (same resource, so the same world) that was admitted; its member list, the same
    object again, needs no second look."""
    if world is None:
        world = world_of(record)
    if world < 0 or world > cfg.max_ranks_per_job:
        return REJECT_BAD_WORLD_SIZE
    limit = world or cfg.max_ranks_per_job
    if rank >= limit:
        return REJECT_RANK_OUT_OF_WORLD
    a = record.attributes
    kind = a.get(schema.ATTR_SPAN_KIND, "")
    if kind == schema.KIND_HEARTBEAT:
        return _heartbeat_reason(a, limit, cfg, admitted)
    elif kind == schema.KIND_COLLECTIVE:
        if _bad_ranks(a.get(schema.ATTR_GROUP_RANKS), limit, cfg):
            return REJECT_BAD_GROUP_RANKS
    elif kind == schema.KIND_P2P:
        for key in (schema.ATTR_P2P_SRC, schema.ATTR_P2P_DST, schema.ATTR_PEER):
            if key in a and _peer_bad(a.get(key), limit):
                return REJECT_PEER_OUT_OF_WORLD
    return None


def run_of(record: SpanRecord) -> str:
    return resource_facts(record.resource)[1]


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
