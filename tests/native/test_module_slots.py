"""The compiled decoder and fold declare their GIL needs (Py_mod_gil, Py_MOD_GIL_USED) for 3.13+.

Built against another CPython 3.13+ found on this machine (python3.13 / python3.13t on PATH or
under pyenv) and imported there: the slots compile and load; on a free-threaded build importing
either enables the GIL (they are not safe without it: docs/native.md). No such interpreter: skip
(the project's own interpreter is older, where Py_mod_gil does not exist and nothing changes).
"""

from __future__ import annotations

import glob
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mycroft.native.extensions import BY_NAME, ROOT, compiler

NAMES = ("mycroft._otlp_fast", "mycroft.rca_service.ingest._fold_fast")


def _interpreters() -> list[str]:
    found = [shutil.which(n) for n in ("python3.13t", "python3.13", "python3.14t", "python3.14")]
    found += glob.glob("/root/.pyenv/versions/3.1[3-9]*/bin/python3.1[3-9]*")
    return sorted({str(Path(p).resolve()) for p in found
                   if p and "/shims/" not in p and re.fullmatch(r"python3\.1[3-9]t?", Path(p).name)})


@pytest.mark.parametrize("python", _interpreters() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no CPython 3.13+ on this machine"))])
def test_gil_slots_compile_and_load_on_3_13(python: str, tmp_path: Path) -> None:
    cc = compiler()
    assert cc is not None
    info = json.loads(subprocess.run(
        [python, "-c", "import json, sys, sysconfig; print(json.dumps([sysconfig.get_paths()['include'], "
         "sysconfig.get_config_var('EXT_SUFFIX'), bool(sysconfig.get_config_var('Py_GIL_DISABLED'))]))"],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    include, suffix, free_threaded = info
    if not (Path(include) / "Python.h").is_file():
        pytest.skip(f"{python} has no headers")
    for name in NAMES:
        ext = BY_NAME[name]
        out = tmp_path / (name.rsplit(".", 1)[1] + suffix)
        subprocess.run([*cc.split(), "-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-I{include}",
                        str(ROOT / ext.source), "-o", str(out)], check=True, capture_output=True, text=True)
    script = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\n"
              "before = getattr(sys, '_is_gil_enabled', lambda: True)()\n"
              "import _otlp_fast, _fold_fast\n"
              "print(json.dumps([before, getattr(sys, '_is_gil_enabled', lambda: True)(), "
              "_otlp_fast.Memo(8) is not None, callable(_fold_fast.fold)]))")
    before, after, memo, fold = json.loads(subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True,
                                                          text=True, check=True, timeout=60).stdout)
    assert memo and fold
    if free_threaded:  # Py_MOD_GIL_USED: the interpreter turns the GIL on to load them
        assert before is False and after is True
