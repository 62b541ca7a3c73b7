"""The harm suite's verdicts, in-process: run_mode stubbed, so no torch test runs here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harm import torch_suite
from tests.harm.torch_suite import FAILED, PASSED, SKIPPED, ModeRun, Outcome


def _run(statuses: dict[str, str], returncode: int | None = 0) -> ModeRun:
    return ModeRun({n: Outcome(s, 1.0, f"{s} detail of {n}") for n, s in statuses.items()}, 1.0, 2.0, returncode,
                   "" if returncode == 0 else "the driver's last line")


def test_harm_needs_the_difference_twice_and_the_rest_is_reported(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    first = {"plain": {"ok": PASSED, "harmed": PASSED, "flaky": PASSED, "skipped": SKIPPED, "broken": FAILED,
                       "helped": FAILED, "cut": PASSED},
             "instrumented": {"ok": PASSED, "harmed": FAILED, "flaky": SKIPPED, "skipped": SKIPPED,
                              "broken": FAILED, "helped": PASSED}}
    reruns = {"plain-rerun": {"harmed": PASSED, "flaky": PASSED},
              "instrumented-rerun": {"harmed": FAILED, "flaky": PASSED}}
    asked: list[tuple[str, list[str]]] = []

    def fake_run_mode(names: list[str], instrumented: bool, env: object, workdir: Path, *args: object,
                      label: str = "", **kwargs: object) -> ModeRun:
        mode = label or ("instrumented" if instrumented else "plain")
        asked.append((mode, list(names)))
        table = first.get(mode) or reruns[mode]
        return _run({n: table[n] for n in names if n in table}, None if mode == "instrumented" else 0)

    monkeypatch.setattr(torch_suite, "run_mode", fake_run_mode)
    comparison = torch_suite.run_suite(list(first["plain"]), {}, tmp_path)
    assert comparison.harm == ["harmed"] and comparison.flaky == ["flaky"]
    assert asked[2:] == [("plain-rerun", ["flaky", "harmed"]), ("instrumented-rerun", ["flaky", "harmed"])]
    assert comparison.both(SKIPPED) == ["skipped"] and comparison.both(FAILED) == ["broken"]
    assert comparison.missing() == ["cut"]
    report = comparison.report()
    assert "HARM: harmed: plain passed, instrumented failed" in report
    assert "failed detail of harmed" in report  # the instrumented failure's lines
    assert "flaky: flaky: plain passed, instrumented skipped" in report
    assert "differs: helped: plain failed, instrumented passed" in report
    assert "the instrumented driver killed at its cap" in report and "the driver's last line" in report
    assert "| harm (differing twice) | 1 |" in comparison.table()


def test_chunks_merge(tmp_path: Path) -> None:
    one = torch_suite.Comparison(_run({"a": PASSED}).outcomes, _run({"a": PASSED}).outcomes,
                                 {"plain": _run({"a": PASSED})}, harm=[])
    two = torch_suite.Comparison(_run({"b": PASSED}).outcomes, _run({"b": FAILED}).outcomes,
                                 {"plain": _run({"b": PASSED})}, harm=["b"])
    merged = torch_suite.Comparison({}, {}).merged(one).merged(two)
    assert merged.names() == ["a", "b"] and merged.harm == ["b"]
    assert merged.runs["plain"].cpu_s == 4.0 and set(merged.runs["plain"].outcomes) == {"a", "b"}
