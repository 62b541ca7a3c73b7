"""The exported ABI: one table per supported profiler version, laid out as NCCL expects."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

VERSIONS = ("v4", "v5", "v6", "v7")


class _Table(ctypes.Structure):
    # name, init, startEvent, stopEvent, recordEventState, finalize: the order NCCL reads
    _fields_ = [("name", ctypes.c_char_p)] + [(n, ctypes.c_void_p) for n in
                                              ("init", "start", "stop", "record", "finalize")]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_exports_a_complete_table(built: Path, version: str) -> None:
    lib = ctypes.CDLL(str(built))
    table = _Table.in_dll(lib, f"ncclProfiler_{version}")
    assert table.name == b"Mycroft"
    pointers = [table.init, table.start, table.stop, table.record, table.finalize]
    assert all(pointers)
    assert len(set(pointers)) == 5


def test_versions_differ_only_in_init_and_start(built: Path) -> None:
    lib = ctypes.CDLL(str(built))
    tables = [_Table.in_dll(lib, f"ncclProfiler_{v}") for v in VERSIONS]
    # each init records its own version (it picks the default event mask); each start knows
    # which descriptor members exist (v5: 64-bit type, v6: CeColl, v7: tag, variant, phases)
    assert len({t.init for t in tables}) == 4 and len({t.start for t in tables}) == 4
    assert len({t.stop for t in tables}) == len({t.record for t in tables}) == len({t.finalize for t in tables}) == 1


def test_only_the_abi_and_the_tool_hooks_are_exported(built: Path) -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(built)], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    ours = {n for n in names if not n.startswith("_")}
    assert ours == {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7", "mycroft_native_flush",
                    "mycroft_native_ring_path", "mycroft_native_clock"}


@pytest.mark.slow
def test_layout_errors_fail_the_build(tmp_path: Path) -> None:
    """The static assertions are live: a wrong offset in the header is a compile error."""
    header = Path(__file__).resolve().parents[2] / "native" / "src" / "nccl_profiler_abi.h"
    bad = tmp_path / "bad.c"
    bad.write_text(f'#include "{header}"\nMC_ASSERT_OFF(mcProxyOpDescr_t, peer, 4);\nint main(void){{return 0;}}\n')
    result = subprocess.run(["cc", "-std=c11", "-c", str(bad), "-o", str(tmp_path / "bad.o")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "offset" in result.stderr


@pytest.mark.parametrize("member", ["mcCollDescr_v7_t, userTag, 96", "mcNcclProfilerEventDescr_v7_t, kernelPhase, 32",
                                    "mcCeCollDescr_v7_t, userTag, 80"])
@pytest.mark.slow
def test_v7_layout_is_pinned(tmp_path: Path, member: str) -> None:
    """A wrong v7 offset (the right ones: coll.userTag 104, kernelPhase 24, ceColl.userTag 88) fails."""
    header = Path(__file__).resolve().parents[2] / "native" / "src" / "nccl_profiler_abi.h"
    bad = tmp_path / "bad7.c"
    bad.write_text(f'#include "{header}"\nMC_ASSERT_OFF({member});\nint main(void){{return 0;}}\n')
    result = subprocess.run(["cc", "-std=c11", "-c", str(bad), "-o", str(tmp_path / "bad.o")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "offset" in result.stderr
