"""The analysis as data (rca_service/postmortem/frames.py): a recording's tables say who arrived late and
who computed how much, and `mycroft rca analyze --export DIR` writes them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

try:
    import pandas as pd
except ImportError:  # the optional 'analysis' extra: ./dev.sh setup installs it, CI fails without it
    pd = None

pytestmark = pytest.mark.requires("pandas")

from mycroft.rca_service import cli, frames  # noqa: E402

from mycroft import schema  # noqa: E402
from mycroft.faults.made_up_job import StepJob, heartbeat  # noqa: E402
from mycroft.otlp import SpanRecord, encode_json  # noqa: E402


def _recording() -> list[SpanRecord]:
    job = StepJob("frames-job", 4, t0=1_700_000_000.0)
    records = job.steps(10) + job.steps(20, slow_rank=1, slow_extra_s=0.05)
    for k, (comm, done) in enumerate([(0.0, 1), (0.5, 11), (1.0, 21), (1.0, 21)]):  # the last interval: a pause
        hb = heartbeat("frames-job", 0, 4, job.now + k, k, [job.group], [job.seq], [job.seq])
        hb.attributes[schema.ATTR_HB_COMM_S] = comm
        hb.attributes[schema.ATTR_HB_OPS_DONE] = done
        hb.start_ns = hb.end_ns = int((job.now + k) * 1e9)
        records.append(hb)
    return records


def test_tables_name_the_late_rank_and_the_compute_share() -> None:
    rec = frames.from_records(_recording())
    assert len(rec.collectives) == 30 * 4 and set(rec.collectives["rank"]) == {0, 1, 2, 3}
    ranks = rec.ranks.set_index("rank")
    assert ranks.loc[1, "last_share"] >= 20 / 30 and ranks["last_share"].idxmax() == 1  # last at every slow step
    assert ranks.loc[1, "mean_arrival_lag_s"] > 0.03 > ranks.loc[2, "mean_arrival_lag_s"]
    assert ranks["mean_arrival_lag_s"].idxmax() == 1
    shares = rec.heartbeats["compute_share"].tolist()
    assert pd.isna(shares[0]) and shares[1:3] == [pytest.approx(0.5)] * 2 and pd.isna(shares[3])
    assert ranks.loc[0, "compute_share"] == pytest.approx(0.5)
    [group] = rec.groups.to_dict("records")
    assert group["members"] == 4 and group["ops"] == 30


def test_analyze_export_writes_the_tables(tmp_path: Path) -> None:
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps(encode_json(_recording())))
    out = tmp_path / "tables"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli.main(["analyze", "--otlp-json", str(spans), "--export", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["collectives.csv", "groups.csv", "heartbeats.csv", "ranks.csv"]
    ranks = pd.read_csv(out / "ranks.csv")
    assert ranks.loc[ranks["mean_arrival_lag_s"].idxmax(), "rank"] == 1
    again = frames.from_files([spans])
    assert len(again.collectives) == len(pd.read_csv(out / "collectives.csv"))
