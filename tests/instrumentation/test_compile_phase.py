"""The heartbeat says `compiling` while torch.compile compiles (instrumentation/compile_phase.py),
registered through the torch.compile wrapper before the first compilation, and unchanged results."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from mycroft.instrumentation.compile_phase import CompileWatch
from mycroft.instrumentation.patching import Patcher, _compile_wrapper

pytestmark = pytest.mark.slow  # compiles (seconds)


def test_compiling_is_seen_during_the_first_compilation_only(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = CompileWatch()
    monkeypatch.setattr("mycroft.instrumentation.patching.COMPILE_WATCH", watch)
    original = torch.compile
    patcher = Patcher()
    patcher.replace(torch, "compile", _compile_wrapper)
    assert torch.compile is not original
    try:
        seen: list[bool] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                seen.append(watch.compiling)
                time.sleep(0.005)

        def f(x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 2 + x.cos()

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        assert not watch.compiling  # torch.compile only wraps; Dynamo compiles at the first call
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        x = torch.arange(6, dtype=torch.float32)
        first = compiled(x)
        done.set()
        sampler.join()
        assert any(seen), "no sample saw the compilation"
        assert not watch.compiling
        torch.testing.assert_close(first, f(x))  # the same result as eager
        seen.clear()
        compiled(x)  # compiled already: no compilation
        assert not watch.compiling
    finally:
        patcher.uninstall()
        for callbacks in (torch._dynamo.callback.callback_handler.start_callbacks,
                          torch._dynamo.callback.callback_handler.end_callbacks):
            callbacks[:] = [cb for cb in callbacks if getattr(cb, "__self__", None) is not watch]
    assert torch.compile is original


def test_a_module_being_imported_is_waited_for_not_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime thread polls while the job's thread imports torch._dynamo.callback: the module is in
    sys.modules before its names are (seen in the framework matrix: phases lost for the whole run)."""
    import importlib.machinery
    import sys
    import types

    from mycroft.instrumentation import compile_phase

    half = types.ModuleType(compile_phase._CALLBACKS)
    half.__spec__ = importlib.machinery.ModuleSpec(compile_phase._CALLBACKS, None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]  # what importlib sets while it runs
    monkeypatch.setitem(sys.modules, compile_phase._CALLBACKS, half)
    watch = CompileWatch()
    watch.poll()
    assert not watch._failed and not watch._registered
    registered: list[object] = []
    half.callback_handler = types.SimpleNamespace(register_start_callback=registered.append,  # type: ignore[attr-defined]
                                                  register_end_callback=registered.append)
    half.__spec__._initializing = False  # type: ignore[attr-defined]
    watch.poll()
    assert watch._registered and registered == [watch._start, watch._end]
