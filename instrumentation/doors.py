"""The functions torch.distributed gets where the compiled hot path is built: builtin "doors".

A door is a builtin function (`_hotpath.door`) bound to a small C object that hands each call to its
`Hot` (the compiled hot path) or, while it has none, to torch's function. The Python shim it replaces
(a frame, `*args` / `**kwargs` packed, a call asking whether Dynamo traces) was ~1 us of every
`dist.*` call after a collective had left the caches cold (2-core VM, slow phase).

Dynamo cannot trace into a builtin, so each door gets a Python stand-in that calls torch's function
(`torch.compiler.substitute_in_graph`): under compilation the door reads as that stand-in, which is
what Dynamo used to trace inside the shim (no graph break; `fullgraph=True` works; Dynamo's own
handling of torch's function is unchanged). Registering needs torch._dynamo, whose import costs
~1.6 s here: a job that never compiles should not pay it, so doors made before Dynamo is imported are
registered by a post-import hook (wrapt's, which opentelemetry-instrumentation already brings), before
Dynamo can trace anything. Where registration is impossible (a torch without substitute_in_graph) the
caller keeps the shim; where it fails later, in the hook, every module attribute holding the door
gets a shim instead (`_fall_back`) and the failure is logged once.

One door per torch function for the life of the process: Dynamo keeps what it registered by identity,
so a door is never dropped (a new recorder only swaps its Hot; `detach` clears it on uninstrument).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_DYNAMO = "torch._dynamo"
_OWNERS = ("torch.distributed", "torch.distributed.distributed_c10d")  # modules whose attributes doors become

_lock = threading.Lock()
_doors: dict[int, Any] = {}  # id(torch's function) -> its door (the door holds the function: the id stays its)
_door_ids: set[int] = set()  # ids of the doors (never dropped: no other object can take one)


class _Originals:
    """torch's functions behind the doors, as attributes (`d<id of the door>`) of a module global: a
    Dynamo stand-in reads its function there, so Dynamo knows where it came from and rewrites torch's
    collective as it does for a direct call (a stand-in's closure variable has no source, and Dynamo
    inlined torch's Python body instead)."""


_originals = _Originals()
_traceable: set[int] = set()  # ids of doors Dynamo has a stand-in for
_waiting: list[Any] = []  # doors made before Dynamo was imported
_refused: set[int] = set()  # ids of doors Dynamo refused a stand-in (logged once)
_hook_set = False


def door(compiled: ModuleType, original: Callable[..., Any]) -> Any:
    """torch's function's door, made once per process."""
    with _lock:
        found = _doors.get(id(original))
        if found is not None:  # it holds `original`: the id is still that function's
            return found
        made = compiled.door(original, getattr(original, "__name__", "collective"),
                             getattr(original, "__module__", None) or "torch.distributed",
                             getattr(original, "__doc__", None))
        _doors[id(original)] = made
        _door_ids.add(id(made))
        setattr(_originals, f"d{id(made)}", original)
        return made


def traceable(door_fn: Any) -> bool:
    """True where Dynamo has, or will have before it traces anything, a stand-in for the door: then
    torch.distributed can hold the door itself; False: the caller puts the shim in front of it."""
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    if compiler is None or not hasattr(compiler, "substitute_in_graph"):
        return False
    global _hook_set
    with _lock:
        if id(door_fn) in _traceable:
            return True
        if _DYNAMO not in sys.modules:
            if not any(door_fn is waiting for waiting in _waiting):  # instrumented again before Dynamo came
                _waiting.append(door_fn)
            if not _hook_set:
                import wrapt

                wrapt.register_post_import_hook(_on_dynamo_import, _DYNAMO)
                _hook_set = True
            return True
    return _register(door_fn)


def _on_dynamo_import(_module: ModuleType) -> None:
    """torch._dynamo has just been imported: register every door made before it."""
    with _lock:
        waiting = list(_waiting)
        _waiting.clear()
    for door_fn in waiting:
        if not _register(door_fn):
            _fall_back(door_fn)


def _register(door_fn: Any) -> bool:
    with _lock:
        if id(door_fn) in _traceable:  # Dynamo refuses a second stand-in for the same door
            return True
    original = door_fn.__self__.original
    key = f"d{id(door_fn)}"

    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        return getattr(_originals, key)(*args, **kwargs)

    try:
        import torch

        torch.compiler.substitute_in_graph(door_fn, skip_signature_check=True)(traced)
    except Exception as exc:
        with _lock:
            first = id(door_fn) not in _refused
            _refused.add(id(door_fn))
        if first:
            log.warning("mycroft: Dynamo cannot trace %s through its door (%r); a Python shim takes its calls",
                        getattr(original, "__name__", original), exc)
        return False
    with _lock:
        _traceable.add(id(door_fn))
    return True


def shim(door_fn: Any) -> Callable[..., Any]:
    """A Python function in front of the door, for a Dynamo without a stand-in for it: Dynamo traces
    into it and calls torch's function, as is_dynamo_compiling() reads True there."""
    original = door_fn.__self__.original
    try:
        import torch

        tracing: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    except Exception:
        def tracing() -> bool:
            return False

    @functools.wraps(original)
    def shim(*args: Any, **kwargs: Any) -> Any:
        if tracing():
            return original(*args, **kwargs)
        return door_fn(*args, **kwargs)

    shim.mycroft_door = door_fn  # type: ignore[attr-defined]
    return shim


def _fall_back(door_fn: Any) -> None:
    """Registration failed after the door was installed: a shim in its place wherever torch has it."""
    replacement = shim(door_fn)
    for name in _OWNERS:
        owner = sys.modules.get(name)
        for attribute, value in list(vars(owner).items()) if owner is not None else ():
            if value is door_fn:
                setattr(owner, attribute, replacement)


def door_of(fn: Any) -> Any:
    """The door behind an installed function (the door itself, or a shim in front of one); None."""
    if id(fn) in _door_ids:
        return fn
    behind = getattr(fn, "mycroft_door", None)
    return behind if id(behind) in _door_ids else None


def detach(fn: Any) -> None:
    """Uninstrumented: the door (if fn is one, or fronts one) calls torch's function alone from now on."""
    found = door_of(fn)
    if found is not None:
        found.__self__.hot = None
