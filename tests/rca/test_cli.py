"""`mycroft rca serve` as users run it: a subprocess that prints its ports, serves, and stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import get_json, http


@pytest.mark.slow
def test_serve_runs_and_stops_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "rca.db"
    proc = subprocess.Popen([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "127.0.0.1:0",
                             "--otlp-http", "127.0.0.1:0", "--http", "127.0.0.1:0", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ports = json.loads(proc.stdout.readline())
        api = f"http://127.0.0.1:{ports['http']}"
        assert get_json(f"{api}/healthz")["status"] == "ok"
        assert get_json(f"{api}/api/v1/incidents") == []
        code, _ = http(f"http://127.0.0.1:{ports['otlp_http']}/v1/traces", b"junk",
                          {"Content-Type": "application/json"})
        assert code == 400
        assert get_json(f"{api}/healthz")["status"] == "ok"  # still serving
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert db.exists()


@pytest.mark.slow
def test_bad_arguments_are_refused_clearly(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    out = subprocess.run([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--http", "nonsense", "--db", str(db)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode != 0 and "HOST:PORT" in out.stderr
    assert not db.exists()
    out = subprocess.run([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--hang-min", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--hang-min" in out.stderr
