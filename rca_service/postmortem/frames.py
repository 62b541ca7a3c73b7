"""A recording as pandas DataFrames: the analysis as data, for notebooks and `analyze --export`.

    from mycroft.rca_service import frames            # the stable path (rca_service/frames.py)
    rec = frames.from_files(["spans.json"])          # or frames.from_records(records)
    rec.collectives   # one row per rank per collective / p2p op: issue, end, duration, arrival lag
    rec.ranks         # one row per rank: ops, durations, lag, how often last to arrive, compute share
    rec.heartbeats    # one row per heartbeat: comm time, ops done, compute share of the interval
    rec.groups        # one row per group: members, ops, median duration and arrival skew

The live service never imports this (pandas is the optional `analysis` extra): the tables
are for people asking questions the verdict does not answer, after the fact. Times are
seconds on the ranks' clocks (span time); `arrival_lag_s` is how long after the group's
first member a rank issued the op, `last` whether it was the last to issue it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mycroft import schema
from mycroft.otlp import SpanRecord

COLLECTIVE_COLUMNS = ["job", "rank", "kind", "group_id", "group", "seq", "op", "bytes", "dtype", "peer", "state",
                      "start_s", "end_s", "duration_s"]
HEARTBEAT_COLUMNS = ["job", "rank", "t_s", "counter", "comm_s", "ops_done", "idle_s", "in_flight", "final"]


@dataclass(slots=True)
class Recording:
    collectives: pd.DataFrame
    heartbeats: pd.DataFrame
    ranks: pd.DataFrame
    groups: pd.DataFrame

    def export(self, directory: str | Path) -> list[Path]:
        """Write every table as CSV into `directory` (created); returns the files."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name in ("collectives", "ranks", "heartbeats", "groups"):
            path = out / f"{name}.csv"
            getattr(self, name).to_csv(path, index=False)
            written.append(path)
        return written


def _collective_rows(records: Iterable[SpanRecord]) -> tuple[list[list[Any]], list[list[Any]]]:
    ops: list[list[Any]] = []
    beats: list[list[Any]] = []
    for r in records:
        rank = r.rank
        if rank is None:
            continue
        a = r.attributes
        if r.kind in (schema.KIND_COLLECTIVE, schema.KIND_P2P):
            start, end = r.start_ns / 1e9, r.end_ns / 1e9
            ops.append([r.job_id, rank, r.kind, str(a.get(schema.ATTR_GROUP_ID, "")),
                        str(a.get(schema.ATTR_GROUP_NAME, "")), int(a.get(schema.ATTR_SEQ, 0) or 0),  # type: ignore[arg-type]
                        str(a.get(schema.ATTR_OP, r.name)), int(a.get(schema.ATTR_BYTES, 0) or 0),  # type: ignore[arg-type]
                        str(a.get(schema.ATTR_DTYPE, "")), int(a.get(schema.ATTR_PEER, -1)),  # type: ignore[arg-type]
                        str(a.get(schema.ATTR_STATE, schema.STATE_COMPLETED)), start, end, end - start])
        elif r.kind == schema.KIND_HEARTBEAT:
            inflight = a.get(schema.ATTR_HB_INFLIGHT_GROUP_IDS)
            beats.append([r.job_id, rank, r.end_ns / 1e9, int(a.get(schema.ATTR_HB_COUNTER, -1)),  # type: ignore[arg-type]
                          float(a.get(schema.ATTR_HB_COMM_S, float("nan"))),  # type: ignore[arg-type]
                          int(a.get(schema.ATTR_HB_OPS_DONE, 0) or 0), float(a.get(schema.ATTR_HB_IDLE_S, 0.0)),  # type: ignore[arg-type]
                          len(inflight) if isinstance(inflight, list | tuple) else 0,
                          bool(a.get(schema.ATTR_HB_FINAL, False))])
    return ops, beats


def collectives_frame(rows: list[list[Any]]) -> pd.DataFrame:
    """Per rank per op, with the arrival lag inside its (job, group, seq) and who issued last."""
    df = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)
    if df.empty:
        return df.assign(arrival_lag_s=pd.Series(dtype=float), last=pd.Series(dtype=bool))
    key = ["job", "kind", "group_id", "seq"]
    first = df.groupby(key)["start_s"].transform("min")
    df["arrival_lag_s"] = df["start_s"] - first
    members = df.groupby(key)["rank"].transform("count")
    df["last"] = (df["start_s"] == df.groupby(key)["start_s"].transform("max")) & (members > 1)
    return df.sort_values(["job", "start_s", "rank"], kind="stable").reset_index(drop=True)


def heartbeats_frame(rows: list[list[Any]]) -> pd.DataFrame:
    """Per heartbeat, and per interval since the rank's previous one: the compute share."""
    df = pd.DataFrame(rows, columns=HEARTBEAT_COLUMNS).sort_values(["job", "rank", "t_s"], kind="stable")
    by = df.groupby(["job", "rank"])
    dt = by["t_s"].diff()
    dcomm = by["comm_s"].diff()
    done = by["ops_done"].diff()
    share = (1.0 - (dcomm / dt).clip(0.0, 1.0)).where((dt > 0) & (done > 0))  # intervals that made progress
    df["compute_share"] = share
    return df.reset_index(drop=True)


def ranks_frame(collectives: pd.DataFrame, heartbeats: pd.DataFrame) -> pd.DataFrame:
    """Per rank: how many ops, how long they took, how late it arrived, and how much it computed."""
    cols = ["job", "rank"]
    if collectives.empty:
        out = pd.DataFrame(columns=[*cols, "ops", "errors", "median_duration_s", "mean_arrival_lag_s",
                                    "last_share"])
    else:
        out = collectives.groupby(cols).agg(
            ops=("seq", "size"), errors=("state", lambda s: int((s != schema.STATE_COMPLETED).sum())),
            median_duration_s=("duration_s", "median"), mean_arrival_lag_s=("arrival_lag_s", "mean"),
            last_share=("last", "mean")).reset_index()
    if not heartbeats.empty:
        hb = heartbeats.groupby(cols).agg(heartbeats=("t_s", "size"), compute_share=("compute_share", "mean"),
                                          last_heartbeat_s=("t_s", "max"), final=("final", "max")).reset_index()
        out = out.merge(hb, on=cols, how="outer")
    return out.sort_values(cols, kind="stable").reset_index(drop=True)


def groups_frame(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per group: its members, ops, median duration and median arrival skew (last minus first issue)."""
    coll = collectives[collectives["kind"] == schema.KIND_COLLECTIVE] if not collectives.empty else collectives
    if coll.empty:
        return pd.DataFrame(columns=["job", "group_id", "group", "members", "ops", "median_duration_s",
                                     "median_skew_s"])
    per_op = coll.groupby(["job", "group_id", "seq"]).agg(group=("group", "first"), skew=("arrival_lag_s", "max"),
                                                          duration=("duration_s", "median")).reset_index()
    out = per_op.groupby(["job", "group_id"]).agg(group=("group", "first"), ops=("seq", "size"),
                                                  median_duration_s=("duration", "median"),
                                                  median_skew_s=("skew", "median")).reset_index()
    members = coll.groupby(["job", "group_id"])["rank"].nunique().rename("members").reset_index()
    return out.merge(members, on=["job", "group_id"]).sort_values(["job", "group"], kind="stable") \
        .reset_index(drop=True)


def from_records(records: Iterable[SpanRecord]) -> Recording:
    ops, beats = _collective_rows(records)
    collectives = collectives_frame(ops)
    heartbeats = heartbeats_frame(beats)
    return Recording(collectives, heartbeats, ranks_frame(collectives, heartbeats), groups_frame(collectives))


def from_files(paths: Sequence[str | Path]) -> Recording:
    """OTLP JSON files (what `mycroft rca analyze --otlp-json` reads)."""
    from .loaders import load_otlp_file

    records: list[SpanRecord] = []
    for path in paths:
        records.extend(load_otlp_file(str(path)))
    return from_records(records)
