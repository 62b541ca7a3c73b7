"""The three CPython extensions under AddressSanitizer + UndefinedBehaviorSanitizer.

mycroft/_otlp_fast.c, rca_service/ingest/_fold_fast.c and instrumentation/_hotpath.c are built
with -fsanitize=address,undefined (-fno-sanitize-recover=undefined) into a temporary directory
(mycroft.native.extensions), never over the installed builds; an uninstrumented CPython runs them
with libasan (and libstdc++, for torch's C++ exceptions) preloaded, PYTHONMALLOC=malloc (so ASan
sees the bounds of Python's own objects: a decoder reading past a bytes object is caught), leak
checks off (CPython keeps objects at exit). A sitecustomize on PYTHONPATH puts an import finder
for the sanitized builds first in every Python process, child processes included.

What runs there: the extensions' differential tests (the compiled decoder against the Python
one, the compiled fold against the Python fold), the compiled hot path's fixed call sequence,
and a short real 2-rank gloo job, instrumented, exporting to an in-process RCA service (the
receiver decodes with _otlp_fast, the ingest folds with _fold_fast). A sanitizer report anywhere
fails the test. Missing toolchain: skip on a developer run, fail under CI (tests/native/sanitize.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mycroft.native import extensions

from . import sanitize

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SAN_ERRORS = ("ERROR: AddressSanitizer", "runtime error:", "AddressSanitizer: CHECK failed", "SUMMARY: ")
SITECUSTOMIZE = f'''import os
if os.environ.get("{extensions.FINDER_ENV}"):
    from mycroft.native.extensions import install_finder
    install_finder()
'''
# the extensions' own tests, in-process (a decode or fold per example): ~30 s of CPU under the sanitizers
UNIT_TESTS = ("tests/test_otlp_differential.py", "tests/test_otlp_fast.py", "tests/rca/test_fold_fast.py")


@pytest.fixture(scope="module")
def san_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    sanitize.require("-fsanitize=address,undefined", tmp_path_factory.mktemp("probe"), runtime="libasan.so",
                     python_headers=True)
    root = tmp_path_factory.mktemp("sanitized")
    try:
        built = extensions.build_sanitized(root / "ext")
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"sanitized build failed: {' '.join(exc.cmd)}\n{exc.stderr}")
    assert set(built) == {e.name for e in extensions.EXTENSIONS}
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = extensions.sanitized_env(root / "ext")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    for key in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG", "MYCROFT_STARTUP_PID"):
        env.pop(key, None)  # coverage of the sanitized runs is not measured (it would double their time)
    # every module comes from the sanitized builds, in a fresh process
    probe = subprocess.run([sys.executable, "-c", "import json, importlib; print(json.dumps({n: importlib."
                            "import_module(n).__file__ for n in " + repr([e.name for e in extensions.EXTENSIONS])
                            + "}))"], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    _clean(probe)
    files = json.loads(probe.stdout.strip().splitlines()[-1])
    assert all(Path(f).parent == root / "ext" for f in files.values()), files
    return env


def _clean(result: subprocess.CompletedProcess[str]) -> None:
    text = result.stdout + result.stderr
    found = [e for e in SAN_ERRORS if e in text]
    assert not found, text[-6000:]
    assert result.returncode == 0, text[-6000:]


def test_extension_unit_tests_under_asan_ubsan(san_env: dict[str, str]) -> None:
    """--capture=sys: pytest's default fd capture would swallow a report written to fd 2 by a dying process."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                             "--capture=sys", *UNIT_TESTS],
                            env=san_env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    _clean(result)
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]


def test_compiled_hot_path_calls_under_asan_ubsan(san_env: dict[str, str]) -> None:
    """The compiled hot path's fixed sequence (tests/instrumentation/jobs/hot_path_calls.py: every sync
    collective, keyword forms, a subgroup, an async op, torch's own errors, 5000 calls past the ring)."""
    job = ROOT / "tests" / "instrumentation" / "jobs" / "hot_path_calls.py"
    result = subprocess.run([sys.executable, str(job), "1"], env=san_env, capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    _clean(result)
    first = json.loads(result.stdout.strip().splitlines()[-2])
    assert first["taken"] >= 12 and len(first["records"]) == 17, first  # the compiled path took the calls


def test_a_real_gloo_job_under_asan_ubsan(san_env: dict[str, str]) -> None:
    """2 gloo ranks, instrumented (the one-line start), a few collectives of each kind, exporting to an
    in-process RCA: the ranks' compiled hot path, the receiver's compiled decoder and the compiled fold
    all ran sanitized, with no report."""
    result = subprocess.run([sys.executable, str(Path(__file__).parent / "san_gloo_job.py"), "driver"], env=san_env,
                            capture_output=True, text=True, timeout=420, cwd=ROOT)
    _clean(result)
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["codes"] == [0, 0] and facts["ranks_seen"] == 2, facts
    for rank in facts["ranks"]:
        assert rank["hot_path_taken"] > 10 and Path(rank["hotpath_file"]).name.startswith("_hotpath"), rank
        assert str(Path(rank["hotpath_file"]).parent) == san_env[extensions.FINDER_ENV], rank
    assert facts["decode_calls"] > 0 and facts["fold_taken"] >= 2, facts
    assert all(Path(f).parent == Path(san_env[extensions.FINDER_ENV]) for f in facts["modules"].values()), facts
