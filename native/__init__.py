"""mycroft.native: the NCCL profiler plugin (C, in src/) and the Python side of its ring.

The plugin is built by `make -C native` (dev.sh does it; `mycroft native build` too) and
loaded by NCCL with NCCL_PROFILER_PLUGIN=<absolute path>; `mycroft native path` prints it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LIBRARY_NAME = "libmycroft_nccl_profiler.so"
PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR / "build"


def library_path() -> Path:
    """Absolute path of the built plugin (NCCL 2.27.3 mangles relative ./ paths)."""
    return BUILD_DIR / LIBRARY_NAME


def build(target: str = "all", quiet: bool = True) -> Path:
    """Run the plugin's Makefile (needs only make and a C compiler); returns the library path."""
    make = shutil.which("make")
    if make is None:
        raise RuntimeError("building the NCCL profiler plugin needs `make` and a C compiler")
    cmd = [make, "-C", str(PACKAGE_DIR)] + (["-s"] if quiet else []) + [target]
    subprocess.run(cmd, check=True)
    return library_path()
