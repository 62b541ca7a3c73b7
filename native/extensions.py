"""Mycroft's three CPython extensions, built outside setuptools: in place, or sanitized elsewhere.

`pip install -e .` builds them (pyproject.toml, optional ext-modules). This module builds the same
sources with the compiler directly, for two uses:

* ``--sanitize``: AddressSanitizer + UndefinedBehaviorSanitizer builds into a separate directory
  (never over the installed ones), loaded ahead of them by `sanitized_env` /
  `install_finder`: an uninstrumented CPython runs them with libasan preloaded.
* ``--inplace NAME``: rebuild one extension where the editable install keeps it, after editing its
  C source (written to a temporary file, then renamed over: a running process keeps its mapping).

    python -m mycroft.native.extensions --sanitize --out /tmp/san      # all three, sanitized
    python -m mycroft.native.extensions --inplace mycroft._otlp_fast
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Extension:
    name: str  # the module's import name
    source: str  # relative to the repository root
    package_dir: str  # where the editable install keeps the built module, relative to the root

    @property
    def filename(self) -> str:
        return self.name.rsplit(".", 1)[1] + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


EXTENSIONS: tuple[Extension, ...] = (
    Extension("mycroft._otlp_fast", "mycroft/_otlp_fast.c", "mycroft"),
    Extension("mycroft.rca_service.ingest._fold_fast", "rca_service/ingest/_fold_fast.c", "rca_service/ingest"),
    Extension("mycroft.instrumentation._hotpath", "instrumentation/_hotpath.c", "instrumentation"),
)
BY_NAME = {e.name: e for e in EXTENSIONS}

SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")
FINDER_ENV = "MYCROFT_SANITIZED_EXTENSIONS"  # the directory install_finder loads the extensions from


def compiler() -> str | None:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return found if found and shutil.which(found.split()[0]) else None


def runtime_library(cc: str, name: str = "libasan.so") -> Path | None:
    """The compiler's sanitizer runtime (to LD_PRELOAD into an uninstrumented python), or None."""
    try:
        out = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(out.strip())
    return path.resolve() if path.is_absolute() and path.exists() else None


def build(ext: Extension, out: Path, sanitize: bool = False, cc: str | None = None) -> Path:
    """Compile one extension to out/<its file name>; returns the path. Raises CalledProcessError
    with the compiler's output on failure."""
    cc = cc or compiler()
    if cc is None:
        raise RuntimeError("building the extensions needs a C compiler (cc, gcc or clang)")
    include = sysconfig.get_paths()["include"]
    out.mkdir(parents=True, exist_ok=True)
    target = out / ext.filename
    tmp = out / f".{ext.filename}.{os.getpid()}.tmp"
    # sanitized: no -fwrapv (setuptools passes Python's, which would hide signed overflow from UBSan)
    flags = ["-O1", "-g", *SANITIZE] if sanitize else ["-O2", "-g", "-fwrapv", "-DNDEBUG"]
    cmd = [*cc.split(), "-shared", "-fPIC", "-std=gnu11", "-Wall", *flags, f"-I{include}", str(ROOT / ext.source),
           "-o", str(tmp)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def build_sanitized(out: Path, names: Sequence[str] | None = None, cc: str | None = None) -> dict[str, Path]:
    """ASan + UBSan builds of the extensions (all, or `names`) into out: {module name: path}."""
    return {e.name: build(e, out, sanitize=True, cc=cc) for e in EXTENSIONS if names is None or e.name in names}


def sanitized_env(out: Path, cc: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a python that loads the sanitized builds in `out` (install_finder reads
    FINDER_ENV): libasan preloaded, leaks not checked (CPython keeps its objects at exit), every
    Python allocation through malloc so ASan sees Python objects' bounds too, UBSan fatal."""
    cc = cc or compiler()
    runtime = runtime_library(cc) if cc else None
    if runtime is None:
        raise RuntimeError(f"no ASan runtime from {cc!r} -print-file-name=libasan.so")
    # libstdc++ too: torch loads it by dlopen, after ASan's __cxa_throw interceptor found no real
    # __cxa_throw, and the first C++ exception (torch's own errors) then fails an ASan CHECK
    cxx = runtime_library(cc, "libstdc++.so.6") if cc else None
    env = dict(os.environ if base is None else base)
    env.update({
        "LD_PRELOAD": " ".join(str(p) for p in (runtime, cxx, env.get("LD_PRELOAD", "")) if p),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:print_summary=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONMALLOC": "malloc",
        FINDER_ENV: str(out),
    })
    return env


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the three extensions from one directory, ahead of the installed ones."""

    def __init__(self, directory: Path) -> None:
        self.files = {e.name: directory / e.filename for e in EXTENSIONS if (directory / e.filename).is_file()}

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def install_finder(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Put the builds in `directory` (default: $MYCROFT_SANITIZED_EXTENSIONS) first on the import
    path; returns the module names it will serve. Call before anything imports them."""
    where = directory if directory is not None else os.environ.get(FINDER_ENV)
    if not where:
        return []
    finder = _Finder(Path(where))
    sys.meta_path.insert(0, finder)
    return sorted(finder.files)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sanitize", action="store_true", help="ASan + UBSan build into --out")
    parser.add_argument("--out", type=Path, default=ROOT / "native" / "build" / "san-ext")
    parser.add_argument("--inplace", nargs="*", metavar="NAME", help="rebuild these (default: all) in place")
    args = parser.parse_args(argv)
    if args.inplace is not None:
        for ext in EXTENSIONS:
            if not args.inplace or ext.name in args.inplace:
                print(build(ext, ROOT / ext.package_dir))
        return 0
    if not args.sanitize:
        parser.error("--sanitize or --inplace")
    for path in build_sanitized(args.out).values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
