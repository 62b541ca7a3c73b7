"""Completeness: per issuer and backend, the collectives torch issued vs the spans that reached the backend.

    .venv/bin/python benchmarks/completeness.py                        # every row below, gloo and nccl_like
    .venv/bin/python benchmarks/completeness.py --frameworks ddp --backends gloo --steps 6 --json out.json

Each row runs one of mycroft/faults/framework_jobs.py's healthy jobs (the issuers a real job has: DDP's C++
reducer, FSDP2, pipelining, compiled code, Megatron- / DeepSpeed-style coalescing, DCP's Python calls) zero-code
under `opentelemetry-instrument torchrun` into an in-process OTLP receiver, on gloo or on the NCCL-like CPU
backend (mycroft/faults/nccl_like.py: the job's `init_process_group("gloo")` is answered with it). The truth is
torch's own Flight Recorder: just before the job destroys its process group, each rank dumps it (this file's
--worker mode wraps `dist.destroy_process_group`; the buffer is raised to 20,000 entries so nothing wraps)
and writes, per group, the collective seqs it recorded and its count of p2p ops. A collective is *spanned* when
the backend got a span of that rank with that group and seq; *extra* counts spans with no such entry (a seq
numbered wrong) and *twice* a (rank, group, seq) spanned more than once.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the jobs run from ROOT (opentelemetry-instrument puts the working directory first on their path);
# MYCROFT_COMPLETENESS_CWD runs them from another checkout (an older commit's tree, for a "before" column)
JOB_CWD = os.environ.get("MYCROFT_COMPLETENESS_CWD", str(ROOT))

# issuer -> framework_jobs row: what issues its collectives
ROWS = {
    "Python calls (dist.*: DCP, hand all-reduce)": "dcp",
    "DDP buckets (C++ reducer)": "ddp",
    "DDP, find_unused_parameters (+ bitmap all-reduce)": "ddp_unused",
    "compiled (torch.compile fullgraph, funcol)": "compile_fullgraph",
    "coalesced (DeepSpeed-style all_reduce_coalesced)": "deepspeed_coalesced",
    "coalesced (Megatron-style _coalescing_manager)": "megatron_coalescing",
    "FSDP2 (fully_shard)": "fsdp2",
    "pipelining (1F1B, p2p)": "pipe_1f1b",
}
NEEDS_FOUR = ("megatron_coalescing",)
ENV_TRUTH = "MYCROFT_COMPLETENESS_TRUTH"


# ------------------------------------------------------------------------------------------ worker
def _truth() -> dict[str, Any]:
    """Per group name: the collective seqs this rank's Flight Recorder holds, and its p2p entries."""
    import torch

    c10d = torch._C._distributed_c10d
    out: dict[str, Any] = {}
    docs: list[dict[str, Any]] = []
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None:
        docs.append(json.loads(nccl(True, False)))
    docs.append(pickle.loads(c10d._dump_fr_trace(True, False, False)))
    for doc in docs:
        for entry in doc.get("entries", []):
            name = str(entry["process_group"][0])
            if not name:
                continue  # a backend torch never named: the NCCL-like groups' inner gloo
            group = out.setdefault(name, {"seqs": [], "p2p": 0})
            if entry.get("is_p2p"):
                group["p2p"] += 1
            elif entry["collective_seq_id"] not in group["seqs"]:
                group["seqs"].append(int(entry["collective_seq_id"]))
    return out


def worker(backend: str, argv: list[str]) -> int:
    import torch.distributed as dist

    from mycroft.faults import framework_jobs

    if backend == "nccl_like":
        from mycroft.faults import nccl_like

        nccl_like.register()
        init = dist.init_process_group

        def init_nccl_like(backend_name: Any = None, *args: Any, **kwargs: Any) -> Any:
            return init(nccl_like.BACKEND if backend_name in (None, "gloo") else backend_name, *args, **kwargs)

        dist.init_process_group = init_nccl_like
    destroy = dist.destroy_process_group

    def destroy_after_truth(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs.get("group"):
            if backend == "nccl_like":
                from mycroft.faults import nccl_like

                nccl_like.synchronize()
            path = Path(os.environ[ENV_TRUTH]) / f"truth-{dist.get_rank()}.json"
            path.write_text(json.dumps(_truth()))
        return destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_after_truth
    return framework_jobs.main(argv)


# ------------------------------------------------------------------------------------------ controller
def run_row(framework: str, backend: str, steps: int, timeout_s: float) -> dict[str, Any]:
    from mycroft import schema
    from mycroft.otlp_server import OtlpReceiver
    from tests.conftest import SpanSink, free_port, instrumented_env

    nproc = 4 if framework in NEEDS_FOUR else 2
    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    job_id = f"complete-{framework}-{backend}"
    try:
        with tempfile.TemporaryDirectory(prefix="mycroft-complete-") as out:
            env = instrumented_env(receiver.grpc_port, MYCROFT_JOB_ID=job_id, MYCROFT_HEARTBEAT_INTERVAL="0.5",
                                   TORCH_FR_BUFFER_SIZE="20000", **{ENV_TRUTH: out})
            command = [str(Path(sys.executable).parent / "opentelemetry-instrument"),
                       str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(nproc),
                       "--master-port", str(free_port()), str(Path(__file__).resolve()), "--worker", backend, "--",
                       "--framework", framework, "--steps", str(steps)]
            began = time.monotonic()
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s,
                                    cwd=JOB_CWD)
            took = time.monotonic() - began
            if result.returncode != 0:  # the first error a worker raised, else torchrun's last words
                raised = re.findall(r"^\[rank\d+\]: (\w+(?:Error|Exception)\b.*)$", result.stderr, flags=re.M)
                return {"framework": framework, "backend": backend,
                        "error": raised[0][:300] if raised else result.stderr[-1500:]}
            truth = {rank: json.loads((Path(out) / f"truth-{rank}.json").read_text()) for rank in range(nproc)}
        finals = lambda spans: {s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}  # noqa: E731
        sink.wait_for(lambda spans: len(finals(spans)) == nproc, 20)
        spans = sink.snapshot()
    finally:
        receiver.stop(0)
    ops = [s for s in spans if s.kind == schema.KIND_COLLECTIVE]
    seen = Counter((s.rank, str(s.attributes[schema.ATTR_GROUP_NAME]), s.attributes[schema.ATTR_SEQ]) for s in ops)
    from_fr = {(s.rank, str(s.attributes[schema.ATTR_GROUP_NAME]), s.attributes[schema.ATTR_SEQ]) for s in ops
               if s.attributes[schema.ATTR_SOURCE] == schema.SOURCE_FLIGHT_RECORDER}
    issued = {(rank, name, seq) for rank, groups in truth.items() for name, g in groups.items() for seq in g["seqs"]}
    p2p_issued = sum(g["p2p"] for groups in truth.values() for g in groups.values())
    p2p_spans = len([s for s in spans if s.kind == schema.KIND_P2P])
    missing = sorted(issued - set(seen))
    beats = [s for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)]
    return {
        "framework": framework, "backend": backend, "ranks": nproc, "steps": steps, "job_s": round(took, 1),
        "issued": len(issued), "spanned": len(issued & set(seen)), "from_flight_recorder": len(issued & from_fr),
        "missing": len(missing), "missing_examples": missing[:8],
        "extra": sum(1 for key in seen if key not in issued), "twice": sum(1 for n in seen.values() if n > 1),
        "p2p_issued": p2p_issued, "p2p_spans": p2p_spans,
        "fr_lost": sum(_number(b.attributes.get(schema.ATTR_HB_FR_LOST)) for b in beats),
        "fr_dump_s": round(sum(_number(b.attributes.get(schema.ATTR_HB_FR_DUMP_S)) for b in beats), 4),
    }


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def table(rows: list[dict[str, Any]]) -> str:
    names = {framework: issuer for issuer, framework in ROWS.items()}
    lines = ["| issuer (framework_jobs row) | backend | collectives issued | spans in the backend | of which from the "
             "Flight Recorder | missing | extra / twice | p2p issued / spans |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        issuer = f"{names.get(row['framework'], row['framework'])} (`{row['framework']}`)"
        if "error" in row:
            lines.append(f"| {issuer} | {row['backend']} | did not run: "
                         f"{row['error'].strip().splitlines()[-1][:120] if row['error'].strip() else '?'} "
                         "| | | | | |")
            continue
        p2p = f"{row['p2p_issued']} / {row['p2p_spans']}" if row["p2p_issued"] or row["p2p_spans"] else "-"
        lines.append(f"| {issuer} | {row['backend']} | {row['issued']} | {row['spanned']} | "
                     f"{row['from_flight_recorder']} | {row['missing']} | {row['extra']} / {row['twice']} | {p2p} |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        backend = sys.argv[2]
        argv = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
        return worker(backend, argv)
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(ROWS.values()))
    parser.add_argument("--backends", default="gloo,nccl_like")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    for framework in args.frameworks.split(","):
        for backend in args.backends.split(","):
            try:
                row = run_row(framework, backend, args.steps, args.timeout)
            except subprocess.TimeoutExpired:
                row = {"framework": framework, "backend": backend, "error": f"timed out after {args.timeout} s"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
