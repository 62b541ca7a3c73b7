"""ASan/UBSan replays and a TSan multi-threaded stress of the plugin (make asan / make tsan).

Where the compiler cannot build and run sanitized code these skip on a developer's run and fail,
naming what is missing, under CI=true or MYCROFT_TEST_STRICT=1 (tests/native/sanitize.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mycroft.native import BUILD_DIR, LIBRARY_NAME
from mycroft.native.emulate import Fault, finish_rank, job_scripts, start_rank

from . import sanitize
from .conftest import make
from .test_chain import SCRIPT as CHAIN_SCRIPT
from .test_edges import EDGES
from .test_hazards import FOREIGN_CTX, KCH_STOP_FIRST, POOL_FULL, STEPS_MISMATCH
from .test_parent_race import ENV as RACE_ENV
from .test_parent_race import RETIRED, REUSED
from .test_v7 import V7

SAN_ERRORS = ("ERROR: AddressSanitizer", "runtime error:", "WARNING: ThreadSanitizer", "ERROR: LeakSanitizer")


def _clean(result: subprocess.CompletedProcess[str] | str) -> None:
    text = result if isinstance(result, str) else result.stderr
    assert not [e for e in SAN_ERRORS if e in text], text[-4000:]
    if not isinstance(result, str):
        assert result.returncode == 0, text[-4000:]


@pytest.fixture(scope="module")
def asan(built: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    sanitize.require("-fsanitize=address,undefined", tmp_path_factory.mktemp("probe"))
    make("asan")
    return BUILD_DIR / "asan" / "driver", BUILD_DIR / "asan" / LIBRARY_NAME


@pytest.fixture(scope="module")
def tsan(built: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    sanitize.require("-fsanitize=thread", tmp_path_factory.mktemp("probe"))
    make("tsan")
    return BUILD_DIR / "tsan" / "driver", BUILD_DIR / "tsan" / LIBRARY_NAME


def _env(ring_dir: Path) -> dict[str, str]:
    return {**os.environ, "MYCROFT_NATIVE_RING_DIR": str(ring_dir),
            "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", "TSAN_OPTIONS": "halt_on_error=1"}


@pytest.mark.parametrize("version", ["v4", "v5", "v6"])
def test_asan_ubsan_replay_of_a_stalled_ring_allreduce(asan: tuple[Path, Path], ring_dir: Path, tmp_path: Path,
                                                       version: str) -> None:
    driver, library = asan
    fault = Fault("network", rank=1, channel=0, step=2)
    for rank, text in enumerate(job_scripts(3, 2, 4, fault)):
        script = tmp_path / f"r{rank}.script"
        script.write_text(text)
        proc = start_rank(script, rank, ring_dir, version, driver=driver, library=library,
                          env={k: v for k, v in _env(ring_dir).items() if k.endswith("_OPTIONS")})
        _clean(finish_rank(proc, timeout=60))


@pytest.mark.parametrize("version", ["v4", "v6"])
def test_asan_ubsan_edge_cases(asan: tuple[Path, Path], ring_dir: Path, tmp_path: Path, version: str) -> None:
    driver, library = asan
    script = tmp_path / "edges.script"
    script.write_text(EDGES)
    _clean(subprocess.run([str(driver), "replay", str(library), version, str(script)], capture_output=True,
                          text=True, env=_env(ring_dir), timeout=120))


@pytest.mark.parametrize("name", ["v7", "pool_full", "foreign_ctx", "steps_mismatch", "kch_stop_first", "chain"])
def test_asan_ubsan_v7_hazards_and_chaining(asan: tuple[Path, Path], ring_dir: Path, tmp_path: Path,
                                            name: str) -> None:
    """The v7 sequences, each hazard replay and a chained run (the counting plugin built with
    ASan too) under ASan/UBSan, leaks included."""
    driver, library = asan
    script, version, env = {
        "v7": (V7, "v7", {"MYCROFT_NATIVE_KERNEL_PHASES": "1"}),
        "pool_full": (POOL_FULL, "v6", {"MYCROFT_NATIVE_POOL_COLLS": "4"}),
        "foreign_ctx": (FOREIGN_CTX, "v6", {}),
        "steps_mismatch": (STEPS_MISMATCH, "v6", {}),
        "kch_stop_first": (KCH_STOP_FIRST, "v6", {}),
        "chain": (CHAIN_SCRIPT, "v7", {"MYCROFT_NATIVE_KERNEL_PHASES": "1",
                                       "MYCROFT_NCCL_PROFILER_CHAIN": str(library.parent / "libchain_counter.so"),
                                       "CHAIN_COUNTER_OUT": str(tmp_path / "counts.json")}),
    }[name]
    path = tmp_path / f"{name}.script"
    path.write_text(script)
    _clean(subprocess.run([str(driver), "replay", str(library), version, str(path)], capture_output=True,
                          text=True, env={**_env(ring_dir), **env}, timeout=120))
    if name == "chain":
        assert '"bad_handle": 0, "bad_parent": 0' in (tmp_path / "counts.json").read_text()


@pytest.mark.parametrize("name", ["retired", "reused"])
def test_asan_ubsan_parent_race(asan: tuple[Path, Path], ring_dir: Path, tmp_path: Path, name: str) -> None:
    """The forced parent/child interleavings (test_parent_race) on the hooked build, under ASan/UBSan."""
    driver, _ = asan
    make("hooks")
    path = tmp_path / f"{name}.script"
    path.write_text({"retired": RETIRED, "reused": REUSED}[name])
    _clean(subprocess.run([str(driver), "replay", str(BUILD_DIR / "asan" / "hooks" / LIBRARY_NAME), "v6", str(path)],
                          capture_output=True, text=True, env={**_env(ring_dir), **RACE_ENV}, timeout=120))


def test_asan_ubsan_stress(asan: tuple[Path, Path], ring_dir: Path) -> None:
    driver, library = asan
    _clean(subprocess.run([str(driver), "stress", str(library), "1500"], capture_output=True, text=True,
                          env=_env(ring_dir), timeout=120))


@pytest.mark.parametrize("ci", [{"CI": "true"}, {"MYCROFT_TEST_STRICT": "1"}])
def test_a_missing_toolchain_fails_under_ci_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       ci: dict[str, str]) -> None:
    """The probe's verdict when the compiler is missing: under CI / strict a failure naming it, never a skip."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MYCROFT_TEST_STRICT", raising=False)
    monkeypatch.setenv("CC", "no-such-cc-43")
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang either
    with pytest.raises(pytest.skip.Exception, match="no C compiler"):
        sanitize.require("-fsanitize=address,undefined", tmp_path)
    for key, value in ci.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(pytest.fail.Exception, match=r"no C compiler.*apt-get install gcc.*fails rather than skips"):
        sanitize.require("-fsanitize=address,undefined", tmp_path)


@pytest.mark.parametrize("ci", [True, False])
def test_a_compiler_without_the_runtime_fails_the_sanitizer_tests_under_ci(built: Path, tmp_path: Path,
                                                                           ci: bool) -> None:
    """End to end: `cc` on PATH cannot link the sanitizers (a wrapper that refuses -fsanitize, as a
    compiler without libasan does): the ASan tests fail under CI=true naming it, and skip otherwise.
    (Before issue 43 they skipped under CI too.)"""
    import shutil
    import sys

    real = shutil.which("cc")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "cc"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in -fsanitize=*) echo 'cannot find -lasan' >&2; "
                    f"exit 1;; esac; done\nexec {real} \"$@\"\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MYCROFT_TEST_STRICT", "CC")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if ci:
        env["CI"] = "true"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                             "tests/native/test_sanitizers.py::test_asan_ubsan_stress"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert "cannot build a program (cannot find -lasan)" in out, out[-3000:]
    if ci:
        assert result.returncode != 0 and "1 error" in out and "skipped" not in out, out[-3000:]
    else:
        assert result.returncode == 0 and "1 skipped" in out, out[-3000:]


def test_tsan_stress_proxy_threads_main_thread_publisher_and_reader(tsan: tuple[Path, Path],
                                                                    ring_dir: Path) -> None:
    """3 communicators: main thread issues collectives, one proxy thread each runs flows and
    steps, the publisher writes the ring, a reader thread drains it, flush() races the publisher,
    then finalize with a collective still open. The driver checks the record accounting."""
    driver, library = tsan
    result = subprocess.run([str(driver), "stress", str(library), "600"], capture_output=True, text=True,
                            env=_env(ring_dir), timeout=120)
    _clean(result)
    assert '"bad": 0' in result.stdout and '"dropped_events": 0' in result.stdout


def test_tsan_stress_with_a_chained_plugin(tsan: tuple[Path, Path], ring_dir: Path, tmp_path: Path) -> None:
    """The same stress with the counting plugin chained (its handles ride in Mycroft's slots,
    forwarded from the proxy threads): no race, the accounting still adds up."""
    driver, library = tsan
    out = tmp_path / "counts.json"
    chain = {"MYCROFT_NCCL_PROFILER_CHAIN": str(library.parent / "libchain_counter.so"), "CHAIN_COUNTER_OUT": str(out)}
    result = subprocess.run([str(driver), "stress", str(library), "300"], capture_output=True, text=True,
                            env={**_env(ring_dir), **chain}, timeout=180)
    _clean(result)
    counts = out.read_text()
    assert '"bad_ctx": 0, "bad_handle": 0, "bad_parent": 0' in counts and '"inits": 3' in counts


def test_tsan_stress_chained_with_mycroft_pools_nearly_empty(tsan: tuple[Path, Path], ring_dir: Path,
                                                             tmp_path: Path) -> None:
    """Pools of 4 flows / kernel channels: most events are Mycroft's drops, so pair slots carry the
    chained plugin's handles, allocated on three proxy threads and freed by the publisher at once
    (grace 0). No race, and the chained plugin still gets every flow, step and kernel channel
    (pair pool big enough: none lost, chain_dropped 0)."""
    import json

    driver, library = tsan
    out = tmp_path / "counts.json"
    env = {**_env(ring_dir), "MYCROFT_NATIVE_POOL_FLOWS": "4", "MYCROFT_NATIVE_POOL_KCHS": "4",
           "MYCROFT_NATIVE_CHAIN_GRACE_MS": "0", "MYCROFT_NATIVE_POOL_PAIRS": "131072", "CHAIN_COUNTER_OUT": str(out),
           "MYCROFT_NCCL_PROFILER_CHAIN": str(library.parent / "libchain_counter.so")}
    result = subprocess.run([str(driver), "stress", str(library), "100"], capture_output=True, text=True, env=env,
                            timeout=180)
    _clean(result)
    stress = json.loads(result.stdout.strip().splitlines()[-1])
    counts = json.loads(out.read_text())
    assert stress["dropped_events"] > stress["flows"] // 2  # Mycroft's pools really were full
    assert (counts["bad_ctx"], counts["bad_handle"], counts["bad_parent"]) == (0, 0, 0)
    assert counts["starts"]["8"] == stress["flows"] + 1 and counts["starts"]["64"] == stress["kchs"]
    assert counts["starts"]["16"] == 8 * stress["flows"] + 1  # every step (8 per flow, 1 on the open flow)
    assert counts["stops"]["8"] == stress["flows"] and counts["stops"]["64"] == stress["kchs"]  # one left open
