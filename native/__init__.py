"""mycroft.native: the NCCL profiler plugin (C, in src/) and the Python side of its ring.

The plugin is built by `pip install` (an optional extension, `_nccl_profiler*.so` beside this
file) and by `make -C native` (dev.sh does it; `mycroft native build` too). The instrumentation
names it in NCCL_PROFILER_PLUGIN itself (instrumentation/nccl_plugin.py); `mycroft native path`
prints the one it names.
"""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
from pathlib import Path

LIBRARY_NAME = "libmycroft_nccl_profiler.so"
PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR / "build"


def library_path() -> Path:
    """Absolute path of the built plugin (NCCL 2.27.3 mangles relative ./ paths)."""
    return BUILD_DIR / LIBRARY_NAME


def installed_plugin() -> Path | None:
    """The plugin NCCL should load: make's build (a developer's freshest) if there is one, else the
    one `pip install` built into the package; None where neither was built (no C compiler)."""
    if library_path().is_file():
        return library_path()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        packaged = PACKAGE_DIR / f"_nccl_profiler{suffix}"
        if packaged.is_file():
            return packaged
    return None


def build(target: str = "all", quiet: bool = True) -> Path:
    """Run the plugin's Makefile (needs only make and a C compiler); returns the library path."""
    make = shutil.which("make")
    if make is None:
        if target == "all":
            return _build_without_make()
        raise RuntimeError(f"`make {target}` needs make; only the plugin itself builds without it")
    cmd = [make, "-C", str(PACKAGE_DIR)] + (["-s"] if quiet else []) + [target]
    subprocess.run(cmd, check=True)
    return library_path()


def _build_without_make() -> Path:
    """The plugin alone, with the compiler the Makefile would use (a machine with cc but no make)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("building the NCCL profiler plugin needs a C compiler (cc, gcc or clang)")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([compiler, "-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-fvisibility=hidden", "-shared",
                    "-o", str(library_path()), str(PACKAGE_DIR / "src" / "plugin.c"), "-pthread", "-ldl"], check=True)
    return library_path()
