"""Whether this machine can build and run sanitized code, and what the tests do when it cannot.

A plain developer `pytest` skips the sanitizer tests where the toolchain is missing; under CI=true
or MYCROFT_TEST_STRICT=1 (./dev.sh test) they FAIL, naming what is missing and what installs it
(tests/components.py's rule for every other component): a green CI then means that they ran.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest
from mycroft.native.extensions import compiler, runtime_library

from tests.components import strict

INSTALL = "apt-get install gcc (Debian/Ubuntu: it brings libasan, libubsan and libtsan; ./dev.sh setup needs it too)"
PROBE = ("#include <pthread.h>\nstatic void* f(void* a){return a;}\n"
         "int main(void){pthread_t t; pthread_create(&t,0,f,0); pthread_join(t,0); return 0;}\n")


def missing(flags: str, tmp: Path, runtime: str | None = None, python_headers: bool = False) -> str | None:
    """Why a `flags` program (e.g. -fsanitize=address,undefined) cannot be built and run here, or None.
    runtime: a library the tests LD_PRELOAD into an uninstrumented python (libasan.so), which the
    compiler must be able to name; python_headers: extensions are built too (Python.h)."""
    cc = compiler()
    if cc is None:
        return "no C compiler: neither $CC, cc, gcc nor clang is on PATH"
    src = tmp / "probe.c"
    src.write_text(PROBE)
    exe = tmp / f"probe{abs(hash(flags))}"
    try:
        built = subprocess.run([*cc.split(), *flags.split(), "-pthread", str(src), "-o", str(exe)],
                               capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{cc}` did not run: {exc}"
    if built.returncode:
        last = (built.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"`{cc} {flags}` cannot build a program ({last})"
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    if ran.returncode:
        return f"a `{flags}` program does not run here (exit {ran.returncode}: {ran.stderr.strip()[-300:]})"
    if runtime is not None and runtime_library(cc, runtime) is None:
        return f"`{cc} -print-file-name={runtime}` names no file (the sanitizer runtime to preload into python)"
    if python_headers:
        include = Path(sysconfig.get_paths()["include"])
        if not (include / "Python.h").is_file():
            return f"Python's headers are missing ({include}/Python.h): install python3-dev or use a full CPython build"
    return None


def require(flags: str, tmp: Path, runtime: str | None = None, python_headers: bool = False) -> None:
    """Skip (developer run) or fail (CI=true, MYCROFT_TEST_STRICT=1) when `flags` cannot be used here."""
    why = missing(flags, tmp, runtime, python_headers)
    if why is None:
        return
    message = f"sanitizer toolchain missing for {flags}: {why}; install: {INSTALL}"
    if strict():
        pytest.fail(f"{message}. Under CI=true / MYCROFT_TEST_STRICT=1 a missing toolchain fails rather than skips.",
                    pytrace=False)
    pytest.skip(message)
