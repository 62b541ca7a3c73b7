"""Fixtures for the native plugin tests: build once per session, a private ring directory."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mycroft.native import BUILD_DIR, PACKAGE_DIR, library_path

DRIVER = BUILD_DIR / "driver"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests here run make, cc, the C driver or emulated ranks: processes, so slow (`-m "not slow"`
    stays in-process), except in modules that declare IN_PROCESS = True."""
    for item in items:
        module = getattr(item, "module", None)
        if HERE in Path(str(item.path)).parents and not getattr(module, "IN_PROCESS", False):
            item.add_marker(pytest.mark.slow)


def make(*targets: str) -> None:
    subprocess.run(["make", "-s", "-C", str(PACKAGE_DIR), *targets], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def built() -> Path:
    """The plugin and the C test driver, built by the project's own Makefile."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("the native tests need make and a C compiler")
    make("all", "driver")
    assert library_path().is_file() and DRIVER.is_file()
    return library_path()


@pytest.fixture()
def ring_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Rings of this test's emulated ranks live here, not in /dev/shm."""
    directory = tmp_path / "rings"
    directory.mkdir()
    monkeypatch.setenv("MYCROFT_NATIVE_RING_DIR", str(directory))
    yield directory
