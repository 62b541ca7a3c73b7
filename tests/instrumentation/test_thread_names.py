"""Mycroft's threads carry their names in the OS (instrumentation/thread_names.py)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from mycroft.instrumentation.thread_names import name_this_thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_NAME) is Linux's")
def test_a_named_thread_shows_its_name_in_proc() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread("mycroft-runtime-and-more")  # cut to the kernel's 15 bytes
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == ["mycroft-runtime"]
    assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "mycroft-runtime"
