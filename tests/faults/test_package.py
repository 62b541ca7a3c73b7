"""The fault harness lives beside the RCA service, never inside it: data and imports flow one way."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module if node.level == 0 else "." * node.level + node.module)
    return names


def test_rca_service_never_imports_the_fault_harness() -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if "faults" in n)
                 for p in (ROOT / "rca_service").glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


@pytest.mark.slow
def test_mycroft_inject_dispatches_to_the_harness() -> None:
    out = subprocess.run([sys.executable, "-m", "mycroft.cli", "inject", "--fault", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown fault" in out.stderr, out.stderr
