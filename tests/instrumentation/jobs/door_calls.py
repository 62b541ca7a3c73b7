"""The doors torch.distributed gets (instrumentation/doors.py), in a real 1-rank gloo process.

    python door_calls.py MODE      MODE: deferred | dynamo_first | registration_fails | no_substitute

deferred: torch._dynamo not imported when instrumenting, twice (its stand-ins registered by the post-import hook);
dynamo_first: imported before; registration_fails: torch.compiler.substitute_in_graph raises (the door must
be replaced by a Python shim wherever torch has it); no_substitute: a torch without substitute_in_graph (the shim
is installed in front of the door from the start). Each mode then: eager calls recorded; a fullgraph
torch.compile of a function with a c10d all_reduce and all_gather_into_tensor (computes as in eager, no
graph break, torch's functional collectives in the graph as without Mycroft); a second recorder after
uninstrument / instrument; a door held across uninstrument (torch's function alone); pickling. Prints one JSON line.
"""

from __future__ import annotations

import importlib
import json
import pickle
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from mycroft.instrumentation import doors, patching
from mycroft.instrumentation.instrumentor import MycroftInstrumentor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def everything_recorded(recorder: Any) -> list[Any]:
    """Every done op this recorder has recorded so far: the runtime thread drains them at any moment (its first
    heartbeat at once), so what it takes is kept aside, and a read takes the rest the same way."""
    taken: list[Any] | None = getattr(recorder, "taken_here", None)
    if taken is None:
        taken = recorder.taken_here = []
        take_done = recorder.take_done

        def keeping() -> list[Any]:
            records = take_done()
            taken.extend(records)
            return records

        recorder.take_done = keeping
    recorder.take_done()
    return list(taken)


class Null(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def compiled_step(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    dist.all_reduce(y)
    out = torch.empty_like(y)
    dist.all_gather_into_tensor(out, y)
    return out + 1


def main() -> None:
    mode = sys.argv[1]
    if mode == "dynamo_first":
        importlib.import_module("torch._dynamo")
    if mode == "registration_fails":
        def refuse(*args: object, **kwargs: object) -> object:
            raise RuntimeError("no stand-ins here")

        torch.compiler.substitute_in_graph = refuse  # type: ignore[assignment]
    if mode == "no_substitute":
        del torch.compiler.substitute_in_graph
    dynamo_at_install = "torch._dynamo" in sys.modules
    instrumentor = MycroftInstrumentor()
    if mode == "deferred":  # instrumented twice before Dynamo comes: each door still gets one stand-in
        instrumentor.instrument(span_exporter=Null())
        instrumentor.uninstrument()
    instrumentor.instrument(span_exporter=Null())
    installed_kind = type(dist.all_reduce).__name__
    # pickled by name, as a Python function of torch.distributed would be (Ray, multiprocessing)
    pickles = pickle.loads(pickle.dumps(dist.all_reduce)) is dist.all_reduce
    held = dist.all_reduce  # as `from torch.distributed import all_reduce` would hold it
    recorder = instrumentor._recorder
    everything_recorded(recorder)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/s", rank=0, world_size=1)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_reduce(tensor=t, group=None, async_op=False)
    eager_ops = [r.op for r in everything_recorded(recorder)]

    from torch._dynamo.utils import counters

    targets: list[str] = []

    def capture(graph: torch.fx.GraphModule, inputs: object) -> object:
        targets.extend(str(node.target) for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    expected = compiled_step(torch.ones(4))  # eager, through the doors
    compiled = torch.compile(compiled_step, fullgraph=True, backend=capture)
    got = compiled(torch.ones(4))
    after_compile_kind = type(dist.all_reduce).__name__

    instrumentor.uninstrument()
    plain = dist.all_reduce
    instrumentor.instrument(span_exporter=Null())
    again = instrumentor._recorder
    everything_recorded(again)
    dist.all_reduce(t)
    dist.all_reduce(t)
    second_recorded = len(everything_recorded(again))
    instrumentor.uninstrument()
    before = len(everything_recorded(again))
    held(t)  # detached: torch's function alone
    # (a held shim, a Python function no longer at its name, cannot be pickled by name: as torch's own)
    held_unpickles_to_torch = pickle.loads(pickle.dumps(held)) is plain if doors.door_of(held) is held else None
    print(json.dumps({
        "dynamo_at_install": dynamo_at_install,
        "installed_kind": installed_kind,
        "pickles": pickles,
        "held_unpickles_to_torch": held_unpickles_to_torch,
        "after_compile_kind": after_compile_kind,
        "eager_ops": eager_ops,
        "compiled_equal": bool(torch.equal(expected, got)),
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_targets": targets,
        "held_is_door": doors.door_of(held) is held,
        "held_detached": patching.hot_path_of(held) is None,
        "restored": dist.all_reduce is plain and type(plain).__name__ == "function",
        "second_recorded": second_recorded,
        "after_uninstrument_recorded": len(everything_recorded(again)) - before,
        "final_value": t[0].item(),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
