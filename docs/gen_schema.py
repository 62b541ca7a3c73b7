"""Writes docs/schema.md from mycroft/schema.py: `python docs/gen_schema.py`.

Meanings of the core names are below; names added later may carry their meaning as an
inline comment in schema.py instead. tests/test_schema.py fails when the page is stale
or a name has no meaning.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mycroft import schema  # noqa: E402

# constant: (type, meaning, example)
MEANINGS: dict[str, tuple[str, str, str]] = {
    "RES_SERVICE_NAME": ("string", "Service name; the job id unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES "
                         "name it", "`llama-70b-run7`"),
    "RES_HOST_NAME": ("string", "Host the rank runs on", "`node-017`"),
    "RES_PROCESS_PID": ("int", "Process id of the rank", "`48121`"),
    "RES_JOB_ID": ("string", "Job id all ranks agree on: MYCROFT_JOB_ID, else TORCHELASTIC_RUN_ID, else "
                   "negotiated once through the c10d store. Also a span attribute", "`9f1c0e2ab3d4c5e6`"),
    "RES_RANK": ("int", "Global rank of the process. Also a span attribute", "`3`"),
    "RES_WORLD_SIZE": ("int", "World size", "`8`"),
    "RES_LOCAL_RANK": ("int", "Rank on its node (LOCAL_RANK)", "`3`"),
    "RES_SCHEMA_VERSION": ("string", "Version of this contract", "`1`"),
    "RES_RUN_ID": ("string", "One launch of the job, the same on every rank (negotiated through the c10d store, "
                   "`.N` = torchelastic restart); two runs under one job id never share RCA state",
                   "`3f9a1c2e7b4d.0`"),
    "SPAN_HEARTBEAT": ("span name", "Per-rank progress record, every MYCROFT_HEARTBEAT_INTERVAL seconds", "—"),
    "SPAN_COLLECTIVE_SUMMARY": ("span name", "One per collective, from the collector processor; no rank", "—"),
    "SPAN_FLOW_SUMMARY": ("span name", "Condensed native per-flow detail (collector processor)", "—"),
    "SPAN_NATIVE_COLL": ("span name", "A collective as NCCL ran it (native plugin)", "—"),
    "SPAN_NATIVE_FLOW": ("span name", "One channel/peer flow of a native collective", "—"),
    "SPAN_NATIVE_STEP": ("span name", "One NCCL proxy step (raw detail)", "—"),
    "SPAN_NATIVE_KERNEL_CHANNEL": ("span name", "One kernel channel of a native collective (GPU timer)", "—"),
    "ATTR_SPAN_KIND": ("string", "Which part of the contract a span is: collective, p2p, heartbeat, "
                       "collective_summary, flow_summary, native_*", "`collective`"),
    "ATTR_OP": ("string", "Op family: all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, "
                "all_to_all, barrier, send, recv. Also the span name", "`all_reduce`"),
    "ATTR_API": ("string", "The exact entry point that issued the op", "`torch.distributed.all_gather_into_tensor`"),
    "ATTR_SOURCE": ("string", "Where the span was observed: python, flight_recorder, native", "`python`"),
    "ATTR_GROUP_ID": ("string", "Stable group id: hash of torch's group name and members, same on every member",
                      "`165bf5ff3037973c`"),
    "ATTR_GROUP_NAME": ("string", "torch's group name (\"0\" is the default group)", "`0`"),
    "ATTR_GROUP_DESC": ("string", "torch's group description", "`default_pg`"),
    "ATTR_GROUP_SIZE": ("int", "Number of members", "`8`"),
    "ATTR_GROUP_RANKS": ("string", "Members, compact (ranges, strides)", "`0-7`, `0-14/2`, `3,5,9-11`"),
    "ATTR_GROUP_RANK": ("int", "This rank's index inside the group", "`2`"),
    "ATTR_SEQ": ("int", "Per-group collective sequence number, the same on every member and equal to Flight "
                 "Recorder's collective_seq_id; p2p: the (src, dst) pair's own counter", "`412`"),
    "ATTR_BYTES": ("int", "Bytes of the op's input on this rank", "`4194304`"),
    "ATTR_DTYPE": ("string", "Element type", "`bfloat16`"),
    "ATTR_PEER": ("int", "p2p: global rank of the other side", "`5`"),
    "ATTR_P2P_SRC": ("int", "p2p: global rank of the sender", "`4`"),
    "ATTR_P2P_DST": ("int", "p2p: global rank of the receiver", "`5`"),
    "ATTR_ROOT": ("int", "Rooted collectives: global rank of src/dst", "`0`"),
    "ATTR_REDUCE_OP": ("string", "Reduction", "`sum`"),
    "ATTR_BACKEND": ("string", "Process-group backend", "`nccl`"),
    "ATTR_ASYNC": ("bool", "Issued with async_op=True (end = completion callback)", "`true`"),
    "ATTR_STATE": ("string", "completed, error, timeout, or in_flight (flushed at exit)", "`completed`"),
    "ATTR_ERROR": ("string", "Error text when the op raised", "`RuntimeError: Connection closed by peer`"),
    "ATTR_TIMING": ("string", "exact (issuing thread / completion callback) or polled (seen by a poller)", "`exact`"),
    "ATTR_SAMPLE_PROBABILITY": ("double", "Keep probability the trace budget gave this op's seq epoch "
                                "(MYCROFT_TRACE_BUDGET): the span stands for 1/p collectives of its stream. "
                                "Absent: kept whatever the budget (no budget, warm-up, or an anomaly)", "`0.1487`"),
    "ATTR_HB_COUNTER": ("int", "Heartbeat number of this rank, +1 each time", "`57`"),
    "ATTR_HB_INTERVAL_S": ("double", "Configured heartbeat interval", "`1.0`"),
    "ATTR_HB_FINAL": ("bool", "Last heartbeat of the process", "`true`"),
    "ATTR_HB_EXIT_REASON": ("string", "Why the process goes: exit, SIGTERM, destroy_process_group, uninstrument",
                            "`SIGTERM`"),
    "ATTR_HB_IDLE_S": ("double", "Seconds since this rank last had an op in flight (0 while one is)", "`12.5`"),
    "ATTR_HB_STACK": ("string", "Python stack of the thread that issues the rank's collectives (the last thread "
                      "to start issuing that is still alive; the main thread before any), innermost last; when "
                      "idle longer than MYCROFT_STACK_AFTER, and on the final heartbeat",
                      "`train.py:88 in load_batch`"),
    "ATTR_HB_THREAD_STACKS": ("string", "The rank's other threads' stacks (Mycroft's own left out), each under a "
                              "`--- thread NAME` line, at most 8 threads and 6,000 characters; sent with the stack",
                              "`--- thread pin_memory\\nthreading.py:320 in wait`"),
    "ATTR_HB_DROPPED": ("int", "Records this rank dropped so far (queue full, export failed, errors)", "`0`"),
    "ATTR_HB_SPANS_KEPT": ("int", "Op spans this rank sent so far under the trace budget (MYCROFT_TRACE_BUDGET)",
                           "`1200`"),
    "ATTR_HB_SPANS_ANOMALIES": ("int", "Op spans sent so far whatever the budget: failed, timed out, slow", "`3`"),
    "ATTR_HB_SPANS_SAMPLED_OUT": ("int", "Op spans this rank did not send so far (sampled away by the budget)",
                                  "`58800`"),
    "ATTR_HB_STEP": ("int", "Training step, when the application reports one", "`1200`"),
    "ATTR_HB_GROUP_IDS": ("string[]", "Groups this rank has used (parallel arrays follow)", "`[\"165b…\"]`"),
    "ATTR_HB_GROUP_NAMES": ("string[]", "torch group names", "`[\"0\"]`"),
    "ATTR_HB_GROUP_SIZES": ("int[]", "Group sizes", "`[8]`"),
    "ATTR_HB_GROUP_RANKS": ("string[]", "Compact member lists", "`[\"0-7\"]`"),
    "ATTR_HB_GROUP_ISSUED": ("int[]", "Last collective seq issued on this rank, per group (0 = none)", "`[412]`"),
    "ATTR_HB_GROUP_COMPLETED": ("int[]", "Last collective seq completed on this rank, per group", "`[411]`"),
    "ATTR_HB_INFLIGHT_GROUP_IDS": ("string[]", "In-flight ops: group (parallel arrays follow)", "`[\"165b…\"]`"),
    "ATTR_HB_INFLIGHT_SEQS": ("int[]", "In-flight ops: seq", "`[412]`"),
    "ATTR_HB_INFLIGHT_OPS": ("string[]", "In-flight ops: op", "`[\"all_reduce\"]`"),
    "ATTR_HB_INFLIGHT_AGES_S": ("double[]", "In-flight ops: seconds since issued", "`[9.75]`"),
    "ATTR_HB_INFLIGHT_PEERS": ("int[]", "In-flight ops: p2p peer, -1 for collectives", "`[-1]`"),
    "ATTR_HB_INFLIGHT_BYTES": ("int[]", "In-flight ops: bytes", "`[4194304]`"),
    "ATTR_HB_FLOW_COMMS": ("string[]", "Native in-flight flows: NCCL commHash, hex (parallel arrays follow)",
                           "`[\"9a3c…\"]`"),
    "ATTR_HB_FLOW_SEQS": ("int[]", "Native flows: NCCL collective seq", "`[88]`"),
    "ATTR_HB_FLOW_CHANNELS": ("int[]", "Native flows: channel", "`[2]`"),
    "ATTR_HB_FLOW_PEERS": ("int[]", "Native flows: the peer's global rank (communicator rank until the "
                           "communicator is mapped to its torch group)", "`[5]`"),
    "ATTR_HB_FLOW_SENDS": ("bool[]", "Native flows: this rank is the sender", "`[true]`"),
    "ATTR_HB_FLOW_STEPS": ("int[]", "Native flows: steps the flow must make", "`[8]`"),
    "ATTR_HB_FLOW_GPU_READY": ("int[]", "Native flows: steps whose data the GPU has produced (G)", "`[4]`"),
    "ATTR_HB_FLOW_TRANSMITTED": ("int[]", "Native flows: steps posted to the network (T)", "`[2]`"),
    "ATTR_HB_FLOW_DONE": ("int[]", "Native flows: steps completed (D)", "`[2]`"),
    "ATTR_HB_FLOW_POSTED": ("", "Native flows: steps the proxy started (send: buffer slot handed to the GPU, "
                            "SendGPUWait; receive: irecv posted), >= gpu_ready", "`[6]`"),
    "ATTR_HB_FLOW_RANKS": ("", "Native flows: global rank owning the flow (another rank's under PXN)", "`[3]`"),
    "ATTR_HB_FLOW_PROXY_STATES": ("", "Native flows: the last ProxyStep state seen (SendGPUWait, SendPeerWait, "
                                  "SendWait, RecvWait, RecvFlushWait, RecvGPUWait)", "`[\"SendWait\"]`"),
    "ATTR_HB_FLOW_KCH_COMMS": ("", "Kernel channels running (started on the GPU, not stopped): NCCL commHash, hex "
                               "(parallel arrays follow)", "`[\"9a3c…\"]`"),
    "ATTR_HB_FLOW_KCH_SEQS": ("", "Kernel channels: the group's collective seq (as flow.seqs; -1 unknown)", "`[88]`"),
    "ATTR_HB_FLOW_KCH_CHANNELS": ("", "Kernel channels: NCCL channel id", "`[0]`"),
    "ATTR_HB_FLOW_KCH_AGES_S": ("", "Kernel channels: seconds since the channel started on the GPU", "`[0.4]`"),
    "ATTR_HB_FLOW_NCOLL_COMMS": ("", "Native collectives enqueued and not finished: NCCL commHash, hex (parallel "
                                 "arrays follow)", "`[\"9a3c…\"]`"),
    "ATTR_HB_FLOW_NCOLL_SEQS": ("", "Native collectives: the group's collective seq (as flow.seqs)", "`[88]`"),
    "ATTR_HB_FLOW_NCOLL_FUNCS": ("", "Native collectives: NCCL function", "`[\"AllReduce\"]`"),
    "ATTR_HB_FLOW_NCOLL_KERNELS": ("", "Native collectives: kernel channels seen for it (started or done)", "`[8]`"),
    "ATTR_HB_FLOW_NCOMM_COMMS": ("", "Every NCCL communicator of the rank, hex (parallel: ncomm.done_seqs)",
                                 "`[\"9a3c…\"]`"),
    "ATTR_HB_FLOW_NCOMM_DONE_SEQS": ("", "Per communicator: highest collective seq finished (-1: none)", "`[87]`"),
    "ATTR_HB_NATIVE_DROPPED": ("", "Native records and events the plugin dropped so far (ring or pools full)", "`0`"),
    "ATTR_HB_COMM_S": ("", "Cumulative seconds this rank had at least one op in flight since init (the rest of "
                       "its time it computed): per interval, compute vs wait on its own clock", "`812.4`"),
    "ATTR_HB_OPS_DONE": ("", "Ops this rank completed since init", "`15210`"),
    "ATTR_HB_GROUP_FR_COMPLETED": ("", "Per group: the Flight Recorder's last completed seq (-1 unknown); sent by "
                                   "device-async backends (NCCL), whose ops complete after their call returns",
                                   "`[411]`"),
    "ATTR_HB_INFLIGHT_RETURNED": ("", "In-flight ops: its call returned (async, NCCL enqueue, issued from C++)",
                                  "`[true]`"),
    "ATTR_HB_INFLIGHT_DTYPES": ("", "In-flight ops: element type (\"\" unknown)", "`[\"bfloat16\"]`"),
    "ATTR_HB_FLOW_AGES_S": ("double[]", "Native flows: seconds since any of the flow's counters (posted, G, T, "
                            "D) last moved; since the flow started when none has", "`[0.003]`"),
    "ATTR_NCCL_COMM_HASH": ("string", "NCCL communicator hash, hex", "`9a3c5d…`"),
    "ATTR_NCCL_FUNC": ("string", "NCCL function", "`AllReduce`"),
    "ATTR_NCCL_ALGO": ("string", "NCCL algorithm", "`Ring`"),
    "ATTR_NCCL_PROTO": ("string", "NCCL protocol", "`Simple`"),
    "ATTR_NCCL_CHANNELS": ("int", "Channels the collective used", "`4`"),
    "ATTR_NCCL_CHANNEL": ("int", "Channel of a flow / step", "`2`"),
    "ATTR_NCCL_IS_SEND": ("bool", "Flow / step is the sending side", "`true`"),
    "ATTR_NCCL_STEPS": ("int", "Steps of the proxy op", "`8`"),
    "ATTR_NCCL_CHUNK_SIZE": ("int", "Bytes per step", "`524288`"),
    "ATTR_NCCL_PID": ("int", "Process that ran the proxy op (PXN: may differ from the rank's)", "`48121`"),
    "ATTR_NCCL_STEP": ("int", "Step index", "`3`"),
    "ATTR_FLOW_GPU_READY": ("int", "Flow counter G: steps the GPU has made ready", "`8`"),
    "ATTR_FLOW_TRANSMITTED": ("int", "Flow counter T: steps posted to the network", "`8`"),
    "ATTR_FLOW_DONE": ("int", "Flow counter D: steps completed", "`8`"),
    "ATTR_FLOW_STALL_STATE": ("string", "Paper's state table: not_started, not_transmitted, not_delivered, "
                              "gpu_not_ready, complete", "`not_transmitted`"),
    "ATTR_SUM_RANKS": ("int[]", "Ranks that reported", "`[0,1,2,3]`"),
    "ATTR_SUM_MISSING_RANKS": ("int[]", "Members that never reported before the window closed", "`[6]`"),
    "ATTR_SUM_EXPECTED": ("int", "Group size", "`8`"),
    "ATTR_SUM_COMPLETE": ("bool", "Every member reported", "`true`"),
    "ATTR_SUM_FIRST_RANK": ("int", "First rank to arrive (issue the op)", "`2`"),
    "ATTR_SUM_LAST_RANK": ("int", "Last rank to arrive", "`5`"),
    "ATTR_SUM_ARRIVAL_SKEW_S": ("double", "Last arrival minus first arrival", "`0.42`"),
    "ATTR_SUM_DURATION_MIN_S": ("double", "Shortest per-rank duration", "`0.01`"),
    "ATTR_SUM_DURATION_MAX_S": ("double", "Longest per-rank duration", "`0.43`"),
    "ATTR_SUM_DURATION_SPREAD_S": ("double", "Max minus min duration", "`0.42`"),
    "ATTR_SUM_ALGBW_GBPS": ("double", "Algorithm bandwidth, bytes / time (nccl-tests)", "`12.5`"),
    "ATTR_SUM_BUSBW_GBPS": ("double", "Bus bandwidth, algbw * nccl-tests factor", "`21.9`"),
    "ATTR_SUM_ANOMALY": ("string", "Why raw detail was kept (slow, skewed, incomplete), empty otherwise", "`skewed`"),
    "ATTR_SUM_FLOWS": ("int", "Native flows condensed into this collective", "`16`"),
    "ATTR_FLOW_SUM_STEP_MEAN_S": ("double", "Flow summary: mean proxy-step duration", "`0.0021`"),
    "ATTR_FLOW_SUM_STEP_MAX_S": ("double", "Flow summary: longest proxy-step duration", "`0.0093`"),
}

SECTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("Resource (one set per rank)", ("RES_",)),
    ("Span names", ("SPAN_",)),
    ("Heartbeat spans (`mycroft.heartbeat`)", ("ATTR_HB_",)),
    ("Native (NCCL) detail", ("ATTR_NCCL_", "ATTR_FLOW_")),
    ("Summary spans (collector processor)", ("ATTR_SUM_", "ATTR_FLOW_SUM_")),
    ("Collective and p2p spans", ("ATTR_",)),
]

INTRO = """# The span contract

Generated from `mycroft/schema.py` by `docs/gen_schema.py`; do not edit by hand.
Every name is defined once in that module and imported from there by every component
(`tests/test_schema.py` checks that this page is current and that no component retypes a
key). Attribute names live under `mycroft.` (OTel naming rules); span names are low-cardinality.

Identities, all pure functions in `mycroft/schema.py`:

- **group id** = hash(torch group name, member ranks). torch names groups "0", "1", ... in
  creation order on every rank, so the id is the same on every member.
- **collective trace id** = hash(job, group id, seq): every rank's span of one collective
  lands in one trace. **p2p trace id** = hash(job, group id, src, dst, pair seq): a send and
  its matching recv share a trace.
- **span id** = hash(trace id, rank): a retried export deduplicates downstream.
- **member lists** are compact: `0-7`, `0-14/2` (stride), `3,5,9-11`.

A collective span starts when the rank issued the op and ends when the op completed on that
rank (async ops: the completion callback of their Work; functional collectives: their
`wait_tensor`). Heartbeat arrays are parallel: index *i* of every `mycroft.hb.group.*` array
describes one group, index *j* of every `mycroft.hb.inflight.*` array one in-flight op, and
likewise for `mycroft.hb.flow.*`.

**Types and units** are the typed contract of `mycroft/schema.py` (`CONTRACT`): OTLP value kinds
(string, int, double, bool, arrays of them) and the unit after the type (`s` seconds, `ns`, `bytes`,
`steps` NCCL proxy steps, `seq` a collective sequence number, `rank` a global rank unless said). The
RCA service checks heartbeats against it (`schema.contract_problems`): a native flow table whose
arrays are not of their types or not all as long as `mycroft.hb.flow.comms` is dropped from the
heartbeat and counted (the rest of the heartbeat is folded).

**Native flows** (`mycroft.hb.flow.*`, filled by `instrumentation/native_reader.py` from the NCCL
profiler plugin's ring):
- `mycroft.hb.flow.peers` and `mycroft.hb.flow.ranks` are *global* (torch) ranks once the
  communicator is mapped to its torch group (`NativeReader.map_comm`, when torch creates the
  communicator); before that, NCCL communicator ranks.
- `mycroft.hb.flow.comms` is NCCL's commHash (16 hex digits), not a torch group id; the mapping
  commHash -> (torch group id, seq offset) is the instrumentation's. `mycroft.hb.flow.seqs` (and the
  `kch` / `ncoll` seqs) are NCCL's collective seqNumber plus that offset: the torch group's
  collective seq (`mycroft.seq`) once mapped, NCCL's own count before.
- `mycroft.hb.flow.ages_s` has one meaning: seconds since any of the flow's counters last moved
  (since the flow started when none has). Kernel-channel ages are since the channel started,
  in-flight op ages since the op was issued.
- The counters are the plugin's snapshot (every `MYCROFT_NATIVE_SNAPSHOT_MS`, 100 ms) read when the
  heartbeat is built: at most one snapshot interval old then, plus the heartbeat's transit.
- Counters per flow: posted <= ... and G >= T >= D; a send flow's G = data produced by the GPU, T =
  posted to the network (isend accepted, which needs the receiver's clear-to-send), D = completion
  seen; a receive flow's G = buffer posted (its clear-to-send), T = data arrived, D = consumed by the GPU.
"""


def inline_comments() -> dict[str, str]:
    source = (ROOT / "mycroft" / "schema.py").read_text()
    return {match.group(1): match.group(2).strip()
            for match in re.finditer(r"^([A-Z_]+): Final = \"[^\"]*\"\s*#\s*(.+)$", source, flags=re.M)}


def render() -> str:
    comments = inline_comments()
    constants = {name: getattr(schema, name) for name in vars(schema) if name.startswith(("RES_", "SPAN_", "ATTR_"))}
    placed: set[str] = set()
    parts = [INTRO]
    for title, prefixes in SECTIONS:
        rows = []
        for name, value in constants.items():
            if value in placed or not name.startswith(prefixes):
                continue
            placed.add(value)
            kind, meaning, example = MEANINGS.get(name, ("", comments.get(name, ""), ""))
            if name in schema.CONTRACT:  # the typed contract: wire type and unit (one source: schema.py)
                wire, unit = schema.CONTRACT[name]
                kind = f"{wire} ({unit})" if unit else wire
            meaning = meaning.replace("|", "\\|")  # a table cell: "a | b" in a comment stays one cell
            rows.append(f"| `{value}` | {kind} | {meaning} | {example} | `{name}` |")
        if rows:
            parts.append(f"\n## {title}\n\n| name | type | meaning | example | constant |\n|---|---|---|---|---|\n"
                         + "\n".join(rows) + "\n")
    return "".join(parts)


if __name__ == "__main__":
    (ROOT / "docs" / "schema.md").write_text(render())
