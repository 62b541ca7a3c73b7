"""A short real gloo job for tests/native/test_sanitizers_ext.py, run with the sanitized extensions.

`driver`: an in-process RCA service (its OTLP receiver decodes with mycroft._otlp_fast, its
ingest folds heartbeats with rca_service.ingest._fold_fast; both counted here), and 2 ranks of
this script in `rank` mode, started the way torchrun sets a worker up (RANK, WORLD_SIZE,
MASTER_ADDR/PORT), instrumented by the one-line start. It waits for the ranks, then for the RCA
to have folded heartbeats of both, and prints one JSON line; exit 1 when a rank failed.
`rank`: every kind of collective a few times (an async one, a subgroup), collectives for ~1.5 s
more (so heartbeats repeat and the compiled fold takes them), destroy_process_group, and its
facts (the compiled hot path's calls, where its extension came from) into $SAN_JOB_OUT.
Every process inherits the sanitizer environment (LD_PRELOAD, the import finder's directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORLD = 2


class Counted:
    """A compiled module's functions, counted (calls, and what fold / fold_run say they took)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: dict[str, int] = {}
        self.taken = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            result = attr(*args, **kwargs)
            if name == "fold":  # 0: declined (the Python fold does it), 1 or 2: folded here
                self.taken += 1 if result else 0
            elif name == "fold_run":
                self.taken += int(result[0])
            return result

        return call


def driver() -> int:
    from mycroft.rca_service.ingest import state

    from mycroft import otlp
    from mycroft.faults.inject import free_port, local_rca

    assert otlp._otlp_fast is not None and state._fold_fast is not None, "the compiled modules are not built"
    decoder, fold = Counted(otlp._otlp_fast), Counted(state._fold_fast)
    otlp._otlp_fast = decoder  # type: ignore[assignment]
    state._fold_fast = fold  # type: ignore[assignment]
    job = f"san-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="mycroft-san-"))
    with local_rca(db_dir=str(work)) as rca:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in ("MYCROFT_STARTUP_PID", "RANK")}
        base.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                    OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_JOB_ID=job, MYCROFT_HEARTBEAT_INTERVAL="0.2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD),
                    LOCAL_WORLD_SIZE=str(WORLD))
        procs = []
        for rank in range(WORLD):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), SAN_JOB_OUT=str(work / f"rank{rank}.json"))
            procs.append(subprocess.Popen([sys.executable, __file__, "rank"], env=env))
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=240))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        summary: dict[str, Any] = {}
        deadline = time.time() + 20
        while time.time() < deadline:
            found = [j for j in rca.service.jobs() if j["job"] == job]
            summary = found[0] if found else {}
            if summary.get("ranks_seen") == WORLD and fold.taken >= 2:
                break
            time.sleep(0.2)
        outs = [work / f"rank{r}.json" for r in range(WORLD)]
        ranks = [json.loads(p.read_text()) if p.exists() else None for p in outs]
    print(json.dumps({
        "codes": codes, "ranks": ranks, "ranks_seen": summary.get("ranks_seen"),
        "heartbeats": summary.get("heartbeats"), "spans": summary.get("spans"),
        "decode_calls": decoder.calls.get("decode", 0), "fold_calls": fold.calls, "fold_taken": fold.taken,
        "modules": {name: getattr(sys.modules.get(name), "__file__", None)
                    for name in ("mycroft._otlp_fast", "mycroft.rca_service.ingest._fold_fast")},
    }))
    return 0 if codes == [0] * WORLD else 1


def rank() -> int:
    import mycroft.instrumentation
    import torch
    import torch.distributed as dist
    from mycroft.instrumentation import patching

    mycroft.instrumentation.start()
    dist.init_process_group("gloo")
    me = dist.get_rank()
    sub = dist.new_group(list(range(WORLD)))
    t = torch.ones(64)
    for _ in range(4):
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        gathered = [torch.zeros(64) for _ in range(WORLD)]
        dist.all_gather(gathered, t)
        dist.all_gather_into_tensor(torch.zeros(64 * WORLD), t)
        dist.reduce_scatter_tensor(torch.zeros(64 // WORLD), t)
        dist.all_reduce(t, group=sub, async_op=True).wait()
        dist.all_gather_object([None] * WORLD, {"rank": me})
        dist.barrier()
    deadline = time.time() + 1.5
    while time.time() < deadline:  # heartbeats repeat: the RCA's compiled fold takes the common ones
        dist.all_reduce(t)
        time.sleep(0.02)
    hot = {id(h): h for h in (patching.hot_path_of(fn) for fn in vars(dist).values()) if h is not None}
    facts = {"rank": me, "hot_path_taken": sum(h.counts()[0] for h in hot.values()),
             "hotpath_file": getattr(sys.modules.get("mycroft.instrumentation._hotpath"), "__file__", None)}
    dist.destroy_process_group()
    Path(os.environ["SAN_JOB_OUT"]).write_text(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(driver() if sys.argv[1] == "driver" else rank())
