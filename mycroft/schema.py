"""The span contract: every span name, attribute name and resource key Mycroft uses.

Every component imports its strings from here; nobody retypes a key. The table in
docs/schema.md documents each name (type, meaning, example) and a test checks that
the table and this module agree.

Also here: the pure helpers that make identities deterministic across ranks
(group ids, trace ids, span ids) and the compact encoding of a group's members.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

SCHEMA_VERSION: Final = "1"
INSTRUMENTATION_SCOPE: Final = "mycroft"

# --------------------------------------------------------------------------------------
# Resource keys (one set per process / rank)
# --------------------------------------------------------------------------------------
RES_SERVICE_NAME: Final = "service.name"
RES_HOST_NAME: Final = "host.name"  # the host identity: SLURM node name, else Kubernetes node, else OS host name
RES_OS_HOST_NAME: Final = "mycroft.host.os_name"  # gethostname() of the rank, where host.name is another name
RES_PROCESS_PID: Final = "process.pid"
RES_JOB_ID: Final = "mycroft.job.id"
RES_RANK: Final = "mycroft.rank"
RES_WORLD_SIZE: Final = "mycroft.world_size"
RES_LOCAL_RANK: Final = "mycroft.local_rank"
RES_SCHEMA_VERSION: Final = "mycroft.schema.version"
RES_RUN_ID: Final = "mycroft.run.id"  # one launch of the job (same on every rank); a relaunch gets a new one
RES_SLURM_JOB_ID: Final = "mycroft.slurm.job_id"  # SLURM_JOB_ID of the rank; the RCA drain_node action requeues it
RES_SLURM_STEP_ID: Final = "mycroft.slurm.step_id"  # SLURM_STEP_ID of the rank (srun's step; "batch" in sbatch)
RES_LAUNCHER: Final = "mycroft.launcher"  # what started the rank: torchrun | slurm | env (startup.py)
RES_NODE_RANK: Final = "mycroft.node_rank"  # the node's index in the job (GROUP_RANK / SLURM_NODEID)
RES_LOCAL_WORLD_SIZE: Final = "mycroft.local_world_size"  # ranks per node (LOCAL_WORLD_SIZE)
RES_KUBE_NODE_NAME: Final = "k8s.node.name"  # the pod's Kubernetes node (downward API); what cordon_node cordons
RES_TRACE_BUDGET: Final = "mycroft.trace.budget"  # double: the job's op spans/s (MYCROFT_TRACE_BUDGET)

# --------------------------------------------------------------------------------------
# Span names (low cardinality). Collective / p2p spans are named by their op (OP_*).
# --------------------------------------------------------------------------------------
SPAN_HEARTBEAT: Final = "mycroft.heartbeat"
SPAN_AGENT: Final = "mycroft.agent"  # a launcher agent's heartbeat while its node waits for the job's others
SPAN_COLLECTIVE_SUMMARY: Final = "mycroft.collective.summary"
SPAN_FLOW_SUMMARY: Final = "mycroft.flow.summary"
SPAN_NATIVE_COLL: Final = "nccl.collective"
SPAN_NATIVE_FLOW: Final = "nccl.flow"
SPAN_NATIVE_STEP: Final = "nccl.proxy_step"
SPAN_NATIVE_KERNEL_CHANNEL: Final = "nccl.kernel_channel"
SPAN_NATIVE_KERNEL_PHASE: Final = "nccl.kernel_phase"  # v7 kernel barrier phase, child of nccl.kernel_channel

# --------------------------------------------------------------------------------------
# Attributes shared by every Mycroft span
# --------------------------------------------------------------------------------------
ATTR_SPAN_KIND: Final = "mycroft.span.kind"
ATTR_RANK: Final = "mycroft.rank"  # also a resource key; copied onto spans for backends without resources
ATTR_JOB_ID: Final = "mycroft.job.id"

# values of ATTR_SPAN_KIND
KIND_COLLECTIVE: Final = "collective"
KIND_P2P: Final = "p2p"
KIND_HEARTBEAT: Final = "heartbeat"
KIND_AGENT: Final = "agent"  # a launcher agent's span (SPAN_AGENT)
KIND_COLLECTIVE_SUMMARY: Final = "collective_summary"
KIND_FLOW_SUMMARY: Final = "flow_summary"
KIND_NATIVE_COLL: Final = "native_collective"
KIND_NATIVE_FLOW: Final = "native_flow"
KIND_NATIVE_STEP: Final = "native_step"
KIND_NATIVE_KERNEL_CHANNEL: Final = "native_kernel_channel"
KIND_NATIVE_KERNEL_PHASE: Final = "native_kernel_phase"

# --------------------------------------------------------------------------------------
# Collective / p2p span (one per rank per op)
# --------------------------------------------------------------------------------------
ATTR_OP: Final = "mycroft.op"  # normalised op family, one of OP_*
ATTR_API: Final = "mycroft.api"  # the exact entry point, e.g. "torch.distributed.all_gather_into_tensor"
ATTR_SOURCE: Final = "mycroft.source"  # one of SOURCE_*
ATTR_GROUP_ID: Final = "mycroft.group.id"
ATTR_GROUP_NAME: Final = "mycroft.group.name"
ATTR_GROUP_DESC: Final = "mycroft.group.desc"
ATTR_GROUP_SIZE: Final = "mycroft.group.size"
ATTR_GROUP_RANKS: Final = "mycroft.group.ranks"  # compact string, see encode_ranks()
ATTR_GROUP_RANK: Final = "mycroft.group.rank"  # this rank's index inside the group
ATTR_SEQ: Final = "mycroft.seq"  # per-group collective sequence number; for p2p the pair's own sequence
ATTR_BYTES: Final = "mycroft.bytes"
ATTR_DTYPE: Final = "mycroft.dtype"
ATTR_PEER: Final = "mycroft.peer"  # global rank of the p2p peer
ATTR_P2P_SRC: Final = "mycroft.p2p.src"  # global rank of the sender
ATTR_P2P_DST: Final = "mycroft.p2p.dst"  # global rank of the receiver
ATTR_ROOT: Final = "mycroft.root"  # global rank of the root for rooted ops
ATTR_REDUCE_OP: Final = "mycroft.reduce_op"
ATTR_BACKEND: Final = "mycroft.backend"
ATTR_ASYNC: Final = "mycroft.async"
ATTR_STATE: Final = "mycroft.state"  # one of STATE_*
ATTR_ERROR: Final = "mycroft.error"
ATTR_TIMING: Final = "mycroft.timing"  # one of TIMING_*

OP_ALL_REDUCE: Final = "all_reduce"
OP_ALL_GATHER: Final = "all_gather"
OP_REDUCE_SCATTER: Final = "reduce_scatter"
OP_BROADCAST: Final = "broadcast"
OP_REDUCE: Final = "reduce"
OP_GATHER: Final = "gather"
OP_SCATTER: Final = "scatter"
OP_ALL_TO_ALL: Final = "all_to_all"
OP_BARRIER: Final = "barrier"
OP_SEND: Final = "send"
OP_RECV: Final = "recv"
COLLECTIVE_OPS: Final = (
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_REDUCE,
    OP_GATHER, OP_SCATTER, OP_ALL_TO_ALL, OP_BARRIER,
)
P2P_OPS: Final = (OP_SEND, OP_RECV)
# ops whose members must pass buffers of equal size (others: uneven splits, root-only buffers)
EQUAL_BYTES_OPS: Final = frozenset({OP_ALL_REDUCE, OP_BROADCAST, OP_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER})
DIGEST_BLOCK: Final = 16
DIGEST_REPEATS: Final = 3

SOURCE_PYTHON: Final = "python"  # a wrapped torch.distributed / functional-collective call
SOURCE_FLIGHT_RECORDER: Final = "flight_recorder"  # seen only in PyTorch's Flight Recorder (e.g. DDP reducer)
SOURCE_NATIVE: Final = "native"  # the NCCL profiler plugin

STATE_COMPLETED: Final = "completed"
STATE_ERROR: Final = "error"
STATE_TIMEOUT: Final = "timeout"
STATE_IN_FLIGHT: Final = "in_flight"  # only on spans flushed at shutdown / signal

TIMING_EXACT: Final = "exact"  # start/end taken on the issuing thread / completion callback
TIMING_POLLED: Final = "polled"  # end observed by a poller; accurate to the poll interval
# added for device-async backends (NCCL: the call returns at enqueue; docs/instrumentation.md)
TIMING_DEVICE_POLLED: Final = "device_polled"  # end: Work.is_completed() seen by the completion poller
TIMING_FLIGHT_RECORDER: Final = "flight_recorder"  # end: the Flight Recorder's last completed seq (watchdog, ~100 ms)
TIMING_INFERRED: Final = "inferred"  # end: a later op of the group completed first (an upper bound, maybe late)
ATTR_CALL_S: Final = "mycroft.call_s"  # seconds the issuing call took on the host (NCCL: enqueue, not completion)
# an end taken from the Flight Recorder's frontier reads (timing flight_recorder): the op ended within this many
# seconds before the span's end (gloo's entries never say when they completed)
ATTR_END_WINDOW_S: Final = "mycroft.end_window_s"  # the op ended within this many seconds before the span's end
ATTR_SAMPLE_PROBABILITY: Final = "mycroft.sample.probability"  # the trace budget kept this op with it (absent: 1)

# --------------------------------------------------------------------------------------
# Heartbeat span (per rank, every MYCROFT_HEARTBEAT_INTERVAL seconds)
# Per-group and per-in-flight-op values are parallel arrays (OTel attributes are flat).
# --------------------------------------------------------------------------------------
ATTR_HB_PHASE: Final = "mycroft.hb.phase"  # importing | rendezvous (before / in init) | training | compiling
ATTR_HB_PHASE_S: Final = "mycroft.hb.phase_s"  # seconds in that phase (start-up phases only)
PHASE_IMPORTING: Final = "importing"
PHASE_RENDEZVOUS: Final = "rendezvous"
PHASE_TRAINING: Final = "training"
# training, inside a torch.compile compilation (Dynamo's compile callbacks): minutes for a large model,
# ranks at different speeds, and a heartbeat thread that the compiler's long GIL holds can starve
PHASE_COMPILING: Final = "compiling"
ATTR_HB_COUNTER: Final = "mycroft.hb.counter"  # increments by one per heartbeat of this rank
ATTR_HB_INTERVAL_S: Final = "mycroft.hb.interval_s"
ATTR_HB_FINAL: Final = "mycroft.hb.final"  # last heartbeat of the process
ATTR_HB_EXIT_REASON: Final = "mycroft.hb.exit_reason"  # "exit", "SIGTERM", ...
EXIT_REASON_ABORTED: Final = "mycroft_abort"  # the rank left on the RCA service's abort_job directive
ATTR_HB_IDLE_S: Final = "mycroft.hb.idle_s"  # seconds since this rank last had an op in flight
# true when every op in flight is an async p2p op whose call returned and no thread waits on a Work:
# the rank posted them and went on (gloo's p2p Works complete only in wait()); idle_s then counts
# from the last call's return
ATTR_HB_POSTED_ONLY: Final = "mycroft.hb.posted_only"  # every op in flight is a posted p2p (returned), none waited on
ATTR_HB_STACK: Final = "mycroft.hb.stack"  # the issuing thread's Python stack (main thread by default), innermost last
# the rank's other threads' stacks (Mycroft's own left out), each under a "--- thread NAME" line; sent with the stack
ATTR_HB_THREAD_STACKS: Final = "mycroft.hb.thread_stacks"
ATTR_HB_DROPPED: Final = "mycroft.hb.dropped"  # telemetry records dropped so far by this rank
# op spans so far by what the trace budget did with them (instrumentation/sampling.py): sent under
# the budget, sent whatever the budget (failed, timed out, slow: anomalies), not sent
ATTR_HB_SPANS_KEPT: Final = "mycroft.hb.spans.kept"
ATTR_HB_SPANS_ANOMALIES: Final = "mycroft.hb.spans.anomalies"
ATTR_HB_SPANS_SAMPLED_OUT: Final = "mycroft.hb.spans.sampled_out"
# collectives issued from C++ (DDP's buckets, ...) that completed between two Flight Recorder reads: spans built
# so far from its entries, those whose entries its ring overwrote before a dump read them (no span), and the
# seconds those dumps held the GIL (instrumentation/flight_recorder.py, FrCoverage)
ATTR_HB_FR_BUILT: Final = "mycroft.hb.fr.built"  # op spans built so far from Flight Recorder entries
ATTR_HB_FR_LOST: Final = "mycroft.hb.fr.lost"  # completed collectives lost to the Flight Recorder's ring wrapping
ATTR_HB_FR_DUMP_S: Final = "mycroft.hb.fr.dump_s"  # cumulative seconds spent in Flight Recorder entries dumps
ATTR_HB_STEP: Final = "mycroft.hb.step"  # optional training step reported by the user
# cumulative seconds the rank had >= 1 op in flight (the rest of its time is compute), and ops
# completed so far: per interval, how much a rank computed vs waited, on its own clock
ATTR_HB_COMM_S: Final = "mycroft.hb.comm_s"  # cumulative seconds with an op in flight since init
ATTR_HB_OPS_DONE: Final = "mycroft.hb.ops_done"  # ops completed since init
# signature digests: per block of DIGEST_BLOCK consecutive collective seqs of a group, the sum
# (mod 2**32) of signature_hash() over the block's ops, once every op of the block completed.
# Members of a group must agree; one that differs issued a different op / size / dtype in it
# (a silent mismatch: float32 vs int32 of equal size completes with garbage). Parallel arrays;
# a closed block is sent in DIGEST_REPEATS heartbeats (a lost heartbeat does not lose it).
ATTR_HB_DIGEST_GROUP_IDS: Final = "mycroft.hb.digest.group_ids"  # group of each closed block
ATTR_HB_DIGEST_BLOCKS: Final = "mycroft.hb.digest.blocks"  # block number: seqs block*B+1 .. (block+1)*B
ATTR_HB_DIGEST_VALUES: Final = "mycroft.hb.digest.values"  # sum of signature_hash() over the block, mod 2**32

ATTR_HB_GROUP_IDS: Final = "mycroft.hb.group.ids"
ATTR_HB_GROUP_NAMES: Final = "mycroft.hb.group.names"
ATTR_HB_GROUP_DESCS: Final = "mycroft.hb.group.descs"  # torch group_desc per group ("mesh_tp", "DATA_PARALLEL_GROUP")
ATTR_HB_GROUP_SIZES: Final = "mycroft.hb.group.sizes"
ATTR_HB_GROUP_RANKS: Final = "mycroft.hb.group.ranks"  # compact strings, see encode_ranks()
ATTR_HB_GROUP_ISSUED: Final = "mycroft.hb.group.issued"  # last issued collective seq per group
ATTR_HB_GROUP_COMPLETED: Final = "mycroft.hb.group.completed"  # last completed collective seq per group

ATTR_HB_INFLIGHT_GROUP_IDS: Final = "mycroft.hb.inflight.group_ids"
ATTR_HB_INFLIGHT_SEQS: Final = "mycroft.hb.inflight.seqs"
ATTR_HB_INFLIGHT_OPS: Final = "mycroft.hb.inflight.ops"
ATTR_HB_INFLIGHT_AGES_S: Final = "mycroft.hb.inflight.ages_s"
ATTR_HB_INFLIGHT_PEERS: Final = "mycroft.hb.inflight.peers"  # -1 for collectives
ATTR_HB_INFLIGHT_BYTES: Final = "mycroft.hb.inflight.bytes"
ATTR_HB_INFLIGHT_DTYPES: Final = "mycroft.hb.inflight.dtypes"  # element type per in-flight op ("" unknown)
ATTR_HB_INFLIGHT_RETURNED: Final = "mycroft.hb.inflight.returned"  # bool per in-flight op: its call returned
ATTR_HB_GROUP_FR_COMPLETED: Final = "mycroft.hb.group.fr_completed"  # per group: FR's last completed seq, -1 unknown

# Native per-flow counters of in-flight NCCL ops (parallel arrays)
ATTR_HB_FLOW_COMMS: Final = "mycroft.hb.flow.comms"  # NCCL commHash, hex
ATTR_HB_FLOW_SEQS: Final = "mycroft.hb.flow.seqs"
ATTR_HB_FLOW_CHANNELS: Final = "mycroft.hb.flow.channels"
ATTR_HB_FLOW_PEERS: Final = "mycroft.hb.flow.peers"
ATTR_HB_FLOW_SENDS: Final = "mycroft.hb.flow.sends"  # bool: this rank is the sending side
ATTR_HB_FLOW_STEPS: Final = "mycroft.hb.flow.steps"  # steps the flow must make
ATTR_HB_FLOW_GPU_READY: Final = "mycroft.hb.flow.gpu_ready"
ATTR_HB_FLOW_TRANSMITTED: Final = "mycroft.hb.flow.transmitted"
ATTR_HB_FLOW_DONE: Final = "mycroft.hb.flow.done"
ATTR_HB_FLOW_AGES_S: Final = "mycroft.hb.flow.ages_s"

# --------------------------------------------------------------------------------------
# Native (NCCL profiler plugin) spans
# --------------------------------------------------------------------------------------
ATTR_NCCL_COMM_HASH: Final = "mycroft.nccl.comm_hash"  # hex
ATTR_NCCL_FUNC: Final = "mycroft.nccl.func"
ATTR_NCCL_ALGO: Final = "mycroft.nccl.algo"
ATTR_NCCL_PROTO: Final = "mycroft.nccl.proto"
ATTR_NCCL_CHANNELS: Final = "mycroft.nccl.channels"
ATTR_NCCL_CHANNEL: Final = "mycroft.nccl.channel"
ATTR_NCCL_IS_SEND: Final = "mycroft.nccl.is_send"
ATTR_NCCL_STEPS: Final = "mycroft.nccl.steps"
ATTR_NCCL_CHUNK_SIZE: Final = "mycroft.nccl.chunk_size"
ATTR_NCCL_PID: Final = "mycroft.nccl.pid"
ATTR_NCCL_STEP: Final = "mycroft.nccl.step"
ATTR_FLOW_GPU_READY: Final = "mycroft.flow.gpu_ready"
ATTR_FLOW_TRANSMITTED: Final = "mycroft.flow.transmitted"
ATTR_FLOW_DONE: Final = "mycroft.flow.done"
ATTR_FLOW_STALL_STATE: Final = "mycroft.flow.stall_state"  # one of FLOW_STATE_*
# added by native/ (documented in docs/native.md)
ATTR_FLOW_POSTED: Final = "mycroft.flow.posted"  # steps the proxy posted (>= gpu_ready)
ATTR_NCCL_PROXY_STATE: Final = "mycroft.nccl.proxy_state"  # last ProxyStep state, e.g. "SendGPUWait"
ATTR_NCCL_PXN: Final = "mycroft.nccl.pxn"  # bool: proxy op run on behalf of another process
ATTR_NCCL_GPU_START_NS: Final = "mycroft.nccl.gpu_start_ns"  # KernelCh GPU globaltimer at start
ATTR_NCCL_GPU_STOP_NS: Final = "mycroft.nccl.gpu_stop_ns"  # KernelCh GPU globaltimer at stop
# added by native/ for NCCL 2.31 (profiler v7) and copy-engine collectives (docs/native.md)
ATTR_NCCL_USER_TAG: Final = "mycroft.nccl.user_tag"  # int: ncclCollConfig_t.userProfilerTag (absent: untagged)
ATTR_NCCL_SYMMETRIC: Final = "mycroft.nccl.symmetric"  # bool: a symmetric-memory kernel collective
ATTR_NCCL_KERNEL_VARIANT: Final = "mycroft.nccl.kernel_variant"  # the kernel that ran it (symmetric kernels)
ATTR_NCCL_COPY_ENGINE: Final = "mycroft.nccl.copy_engine"  # bool: a copy-engine collective (CeColl event)
ATTR_NCCL_KERNEL_PHASE: Final = "mycroft.nccl.kernel_phase"  # initial_sync | compute | final_sync
ATTR_NCCL_STALE: Final = "mycroft.nccl.stale"  # bool: kernel channel whose stop never came (NCCL PR #2221)
# in-flight kernel channels and collectives (parallel arrays): intra-node evidence without proxy events;
# named ATTR_HB_FLOW_* so the RCA's heartbeat fold (rca_service/ingest/state.py FLOW_KEYS) keeps them with the flows
ATTR_HB_FLOW_KCH_COMMS: Final = "mycroft.hb.kch.comms"  # NCCL commHash, hex
ATTR_HB_FLOW_KCH_SEQS: Final = "mycroft.hb.kch.seqs"  # NCCL seq of each channel's collective (-1: unknown)
ATTR_HB_FLOW_KCH_CHANNELS: Final = "mycroft.hb.kch.channels"  # NCCL channel id
ATTR_HB_FLOW_KCH_AGES_S: Final = "mycroft.hb.kch.ages_s"  # seconds since the kernel channel started
ATTR_HB_FLOW_NCOLL_COMMS: Final = "mycroft.hb.ncoll.comms"  # enqueued native collectives not finished yet
ATTR_HB_FLOW_NCOLL_SEQS: Final = "mycroft.hb.ncoll.seqs"  # NCCL seq of each enqueued collective
ATTR_HB_FLOW_NCOLL_FUNCS: Final = "mycroft.hb.ncoll.funcs"  # NCCL func name, e.g. AllReduce
ATTR_HB_FLOW_NCOLL_KERNELS: Final = "mycroft.hb.ncoll.kernels"  # kernel channels seen for it (started or done)
ATTR_HB_FLOW_NCOMM_COMMS: Final = "mycroft.hb.ncomm.comms"  # every NCCL communicator of the rank, hex
ATTR_HB_FLOW_NCOMM_DONE_SEQS: Final = "mycroft.hb.ncomm.done_seqs"  # highest collective seq finished in it (-1: none)
ATTR_HB_FLOW_POSTED: Final = "mycroft.hb.flow.posted"  # parallel to ATTR_HB_FLOW_* above
ATTR_HB_FLOW_RANKS: Final = "mycroft.hb.flow.ranks"  # rank owning the flow (differs under PXN)
ATTR_HB_FLOW_PROXY_STATES: Final = "mycroft.hb.flow.proxy_states"  # last ProxyStep state per flow
ATTR_HB_NATIVE_DROPPED: Final = "mycroft.hb.native.dropped"  # native records + events dropped so far

# Mycroft's per-flow state table (paper): where a flow that does not progress is stuck.
FLOW_STATE_NOT_STARTED: Final = "not_started"  # G = T = D = 0
FLOW_STATE_NOT_TRANSMITTED: Final = "not_transmitted"  # G > T
FLOW_STATE_NOT_DELIVERED: Final = "not_delivered"  # T > D
FLOW_STATE_GPU_NOT_READY: Final = "gpu_not_ready"  # G = T = D > 0, behind the peers
FLOW_STATE_COMPLETE: Final = "complete"
# where a collective stands on a rank when only kernel-channel evidence exists (intra-node, no proxy
# events: rca_service/analysis/kernel_progress.py)
KERNEL_STATE_RUNNING: Final = "kernel_running"  # its kernel started on the GPU and has not finished
KERNEL_STATE_NOT_STARTED: Final = "kernel_not_started"  # enqueued, its kernel not started on the GPU
KERNEL_STATE_NOT_ENQUEUED: Final = "not_enqueued"  # the rank's NCCL has not been given the collective

# --------------------------------------------------------------------------------------
# Agent span (per launcher agent -- torchrun's, one per node -- every heartbeat interval while
# its node waits for the job's other nodes; its workers, and so their ranks, start only after).
# Counter, interval, phase (PHASE_NODE_RENDEZVOUS) and phase_s as in a heartbeat; ATTR_HB_FINAL
# once the node rendezvous completed (the workers report from then on) or the agent gave up.
# --------------------------------------------------------------------------------------
PHASE_NODE_RENDEZVOUS: Final = "node_rendezvous"  # an agent waiting for the job's other nodes
ATTR_AGENT_RDZV_BACKEND: Final = "mycroft.agent.rdzv_backend"  # c10d | static | etcd-v2 ...
ATTR_AGENT_NODES_MIN: Final = "mycroft.agent.nodes_min"  # nodes the rendezvous waits for (--nnodes MIN[:MAX])
ATTR_AGENT_NODES_MAX: Final = "mycroft.agent.nodes_max"  # ... and at most (elastic: the round waits for more)
ATTR_AGENT_NODES_JOINED: Final = "mycroft.agent.nodes_joined"  # nodes in the round so far (-1: not readable)
ATTR_AGENT_JOINED_HOSTS: Final = "mycroft.agent.joined_hosts"  # their hosts, as the rendezvous names them
ATTR_AGENT_EXPECTED_HOSTS: Final = "mycroft.agent.expected_hosts"  # the job's hosts, where the launcher tells them

# --------------------------------------------------------------------------------------
# Collective summary span (collector_processor; belongs to the collective, no mycroft.rank)
# --------------------------------------------------------------------------------------
ATTR_SUM_RANKS: Final = "mycroft.summary.ranks"  # int[] ranks that reported
ATTR_SUM_MISSING_RANKS: Final = "mycroft.summary.missing_ranks"  # int[]
ATTR_SUM_EXPECTED: Final = "mycroft.summary.expected"  # group size
ATTR_SUM_COMPLETE: Final = "mycroft.summary.complete"  # every member reported
ATTR_SUM_FIRST_RANK: Final = "mycroft.summary.first_rank"
ATTR_SUM_LAST_RANK: Final = "mycroft.summary.last_rank"
ATTR_SUM_ARRIVAL_SKEW_S: Final = "mycroft.summary.arrival_skew_s"
ATTR_SUM_DURATION_MIN_S: Final = "mycroft.summary.duration_min_s"
ATTR_SUM_DURATION_MAX_S: Final = "mycroft.summary.duration_max_s"
ATTR_SUM_DURATION_SPREAD_S: Final = "mycroft.summary.duration_spread_s"
ATTR_SUM_ALGBW_GBPS: Final = "mycroft.summary.algbw_gbps"
ATTR_SUM_BUSBW_GBPS: Final = "mycroft.summary.busbw_gbps"
ATTR_SUM_ANOMALY: Final = "mycroft.summary.anomaly"  # "" or why the raw detail was kept
ATTR_SUM_FLOWS: Final = "mycroft.summary.flows"  # condensed native flows
ATTR_SUM_ALGO: Final = "mycroft.summary.algo"  # NCCL algo most ranks used, else the backend ("gloo")
ATTR_SUM_PROTO: Final = "mycroft.summary.proto"  # NCCL protocol most ranks used, "" without native detail
ATTR_SUM_BUSBW_FACTOR: Final = "mycroft.summary.busbw_factor"  # nccl-tests factor: busbw = algbw * factor
ATTR_SUM_EFFECTIVE_S: Final = "mycroft.summary.effective_s"  # last arrival -> last completion
ATTR_SUM_CLOSED: Final = "mycroft.summary.closed"  # why the join window closed, one of CLOSED_*
ATTR_SUM_ERROR_RANKS: Final = "mycroft.summary.error_ranks"  # int[] ranks whose state is not completed
ATTR_SUM_DETAIL_SPANS: Final = "mycroft.summary.detail_spans"  # native detail spans seen for the collective
ATTR_SUM_KEPT_REASON: Final = "mycroft.summary.kept_reason"  # on raw native detail the processor kept

CLOSED_COMPLETE: Final = "complete"  # every member reported
CLOSED_TIMEOUT: Final = "timeout"  # the window expired with members missing
CLOSED_EVICTED: Final = "evicted"  # closed early to bound memory
CLOSED_SHUTDOWN: Final = "shutdown"  # flushed when the processor stopped

ANOMALY_INCOMPLETE: Final = "incomplete"
ANOMALY_ERROR: Final = "error"
ANOMALY_SKEWED: Final = "skewed"
ANOMALY_SLOW: Final = "slow"

# Flow summary span (one per rank, channel, peer and direction of a collective)
ATTR_FLOW_SUM_RAW_SPANS: Final = "mycroft.flow_summary.raw_spans"  # native detail spans condensed
ATTR_FLOW_SUM_STEPS: Final = "mycroft.flow_summary.steps"  # proxy steps observed
ATTR_FLOW_SUM_STEP_MEAN_S: Final = "mycroft.flow_summary.step_mean_s"  # mean proxy-step duration
ATTR_FLOW_SUM_STEP_MAX_S: Final = "mycroft.flow_summary.step_max_s"  # longest proxy-step duration
ATTR_FLOW_SUM_BYTES: Final = "mycroft.flow_summary.bytes"  # completed steps * chunk size
ATTR_FLOW_SUM_GBPS: Final = "mycroft.flow_summary.gbps"  # flow throughput: bytes / (last end - first start)

# Instrumentation scope of every span the collector processor emits (summaries, kept detail):
# a processor passes spans of this scope through untouched, so chained or looped-back
# processors never join or condense twice.
PROCESSOR_SCOPE: Final = "mycroft.collector_processor"


# --------------------------------------------------------------------------------------
# Pure helpers: deterministic identities
# --------------------------------------------------------------------------------------
def _digest(*parts: object) -> bytes:
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def group_id(group_name: str, member_ranks: Sequence[int]) -> str:
    """Stable id of a process group: the same on every member and across restarts.

    torch names groups "0", "1", ... in creation order on every rank, so the name plus
    the member list tells two groups over the same ranks apart.
    """
    return _digest("group", group_name, encode_ranks(member_ranks)).hex()[:16]


@functools.lru_cache(maxsize=8192)
def _digest_prefix(*parts: object) -> Any:
    """The blake2b state after `_digest`'s text up to its last part: ids that differ only in a last
    part (a seq) hash on from a copy of it, the same bytes as `_digest` (half its time per op: a
    rank's background thread computes one per collective)."""
    return hashlib.blake2b(("\x1f".join(str(part) for part in parts) + "\x1f").encode(), digest_size=16)


def _digest_last(prefix: tuple[object, ...], last: int) -> bytes:
    """`_digest(*prefix, last)`."""
    state = _digest_prefix(*prefix).copy()
    state.update(str(last).encode())
    return bytes(state.digest())


def collective_trace_id(job_id: str, group: str, seq: int) -> int:
    """Trace id shared by every rank's span of collective `seq` in group `group`."""
    return collective_trace_ids(job_id, group)(seq)


@functools.lru_cache(maxsize=8192)
def collective_trace_ids(job_id: str, group: str) -> Callable[[int], int]:
    """`collective_trace_id(job_id, group, seq)` as a function of seq: `_digest("coll", job_id, group, seq)`
    hashed on from the group's prefix state (a rank's background thread computes one per collective it
    drains: ~0.5 us each this way)."""
    copy = _digest_prefix("coll", job_id, group).copy
    from_bytes = int.from_bytes

    def trace_id(seq: int) -> int:
        state = copy()
        state.update(b"%d" % seq)
        return from_bytes(state.digest(), "big") or 1

    return trace_id


def p2p_trace_id(job_id: str, group: str, src: int, dst: int, pair_seq: int) -> int:
    """Trace id shared by the send and the matching recv (the pair's own sequence)."""
    return int.from_bytes(_digest_last(("p2p", job_id, group, src, dst), pair_seq), "big") or 1


def signature_hash(seq: int, op: str, nbytes: int, dtype: str) -> int:
    """What every member of a group must agree on for one collective (see ATTR_HB_DIGEST_*)."""
    size = nbytes if op in EQUAL_BYTES_OPS else 0
    return zlib.crc32(f"{seq}:{op}:{size}:{dtype}".encode())


def digest_block(seq: int) -> int:
    """The digest block of a collective seq (seqs start at 1)."""
    return (seq - 1) // DIGEST_BLOCK


def rank_span_id(trace_id: int, rank: int, salt: str = "") -> int:
    """Deterministic span id of one rank's span in a trace (retries dedupe downstream).

    `_digest("span", trace_id, rank, salt)`'s bytes, formatted as bytes directly (one per op span a rank
    sends: 1.5 -> 0.8 us)."""
    text = b"span\x1f%d\x1f%d\x1f" % (trace_id, rank) + salt.encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=16).digest()[:8], "big") or 1


def keep_trace(trace_id: int, ratio: float) -> bool:
    """Head sampling by trace id, the rule of OTel's TraceIdRatioBased sampler (low 64 bits
    below ratio * 2^64). Collective trace ids are the same on every rank, so every rank
    keeps or drops the same collectives: a kept collective is whole."""
    return (trace_id & TRACE_ID_LOW_BITS) < keep_threshold(ratio)


TRACE_ID_LOW_BITS = 0xFFFF_FFFF_FFFF_FFFF


def keep_threshold(ratio: float) -> int:
    """keep_trace(trace_id, ratio) is `trace_id & TRACE_ID_LOW_BITS < keep_threshold(ratio)`."""
    if ratio >= 1.0:
        return 1 << 64
    if ratio <= 0.0:
        return 0
    return int(ratio * (1 << 64))


def encode_ranks(ranks: Iterable[int]) -> str:
    """Compact, human-readable member list: "0-7", "0-14/2", "3,5,9-11".

    Groups at scale are mostly arithmetic progressions, so a 16k-rank world is "0-16383".
    """
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        if i + 1 < len(values):
            step = values[i + 1] - values[i]
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
            if j - i >= 2 or (j - i == 1 and step == 1):
                parts.append(f"{values[i]}-{values[j]}" + (f"/{step}" if step != 1 else ""))
                i = j + 1
                continue
        parts.append(str(values[i]))
        i += 1
    return ",".join(parts)


MAX_DECODED_RANKS: Final = 1 << 18  # twice the largest job the RCA keeps state for


def _rank_parts(text: str, world_size: int | None, max_count: int) -> tuple[list[tuple[int, int, int]], int]:
    """Parse a compact rank list into (first, last, step) parts and their total count, expanding nothing."""
    if len(text) > 16 * max_count:
        raise ValueError(f"rank list of {len(text)} characters")
    count = 0
    parts = []
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        first_text, dash, last_text = span.partition("-")
        first = int(first_text)
        last = int(last_text) if dash else first
        step = int(step_text) if step_text else 1
        if step <= 0:
            raise ValueError(f"bad stride in rank list: {part!r}")
        if first < 0 or last < first:
            raise ValueError(f"bad range in rank list: {part!r}")
        if world_size is not None and last >= world_size:
            raise ValueError(f"rank {last} in rank list is outside the world of {world_size}")
        count += (last - first) // step + 1
        if count > max_count:
            raise ValueError(f"rank list names more than {max_count} ranks")
        parts.append((first, last, step))
    return parts, count


def count_ranks(text: str, world_size: int | None = None, max_count: int = MAX_DECODED_RANKS) -> int:
    """How many ranks a compact list names, validated like decode_ranks() but without expanding it."""
    return _rank_parts(text, world_size, max_count)[1] if text else 0


def decode_ranks(text: str, world_size: int | None = None, max_count: int = MAX_DECODED_RANKS) -> list[int]:
    """Inverse of encode_ranks(); raises ValueError on malformed input.

    Bounded before anything is expanded: a 9-byte "0-999999999" would otherwise be a
    billion ints. Every rank must be >= 0 (and < world_size when given), and the list
    at most `max_count` long; both are checked on the range ends, arithmetically.
    """
    ranks: list[int] = []
    if not text:
        return ranks
    for first, last, step in _rank_parts(text, world_size, max_count)[0]:
        if first == last:
            ranks.append(first)
        else:
            ranks.extend(range(first, last + 1, step))
    return ranks


def flow_state(gpu_ready: int, transmitted: int, done: int, steps: int) -> str:
    """Mycroft's per-flow state table (the paper): where a flow that stopped is stuck.

    Pure, from the flow's own counters; the collector (condensing) and the RCA service
    (verdicts) both apply it, so it lives with the FLOW_STATE_* names.
    """
    if steps > 0 and done >= steps:
        return FLOW_STATE_COMPLETE
    if gpu_ready == transmitted == done == 0:
        return FLOW_STATE_NOT_STARTED
    if gpu_ready > transmitted:
        return FLOW_STATE_NOT_TRANSMITTED
    if transmitted > done:
        return FLOW_STATE_NOT_DELIVERED
    return FLOW_STATE_GPU_NOT_READY


def trace_id_hex(trace_id: int) -> str:
    return f"{trace_id:032x}"


def span_id_hex(span_id: int) -> str:
    return f"{span_id:016x}"


# --------------------------------------------------------------------------------------
# The control path found (instrumentation/control_discovery.py): the RCA service answers "where is your
# control API?" on its OTLP ports, as JSON {"port": N, "scheme": "http"|"https"}
CONTROL_GRPC_SERVICE: Final = "mycroft.control.v1.Control"  # its unary method CONTROL_GRPC_METHOD, bytes in/out
CONTROL_GRPC_METHOD: Final = "Where"
CONTROL_HTTP_PATH: Final = "/mycroft/v1/control"  # GET on the OTLP/HTTP port


# --------------------------------------------------------------------------------------
# The typed contract (issue 44): the wire type and unit of every attribute above, one meaning each
# (docs/schema.md, generated by docs/gen_schema.py, shows them; tests/rca/test_contract.py keeps every
# name typed). Types are OTLP AnyValue kinds: string, int, double, bool and arrays of them. The RCA
# service checks heartbeats against it (contract_problems) before folding them.
#
# Identities the flow arrays use (instrumentation/native_reader.py):
# - ATTR_HB_FLOW_PEERS, ATTR_HB_FLOW_RANKS: *global* ranks (torch's), translated from NCCL's communicator
#   ranks through the communicator's member list once the communicator is mapped to its torch group
#   (NativeReader.map_comm); before that mapping they are communicator ranks.
# - ATTR_HB_FLOW_COMMS: NCCL's commHash (hex, 16 digits), not a torch group id: one torch group has one
#   communicator per device stream set; the mapping commHash -> (torch group id, seq offset) is made by
#   the instrumentation when torch creates the communicator.
# - ATTR_HB_FLOW_SEQS / ATTR_HB_FLOW_KCH_SEQS / ATTR_HB_FLOW_NCOLL_SEQS: NCCL's collective seqNumber plus
#   that seq offset, i.e. the torch group's collective seq (ATTR_SEQ) once mapped; NCCL's own count before.
# - ATTR_HB_FLOW_AGES_S: seconds since any of the flow's counters (posted, G, T, D) last moved; since the
#   flow started when none has. The one definition; ages of kernel channels (ATTR_HB_FLOW_KCH_AGES_S) are
#   since the channel started, ages of in-flight ops (ATTR_HB_INFLIGHT_AGES_S) since the op was issued.
# - The counters are the plugin's snapshot (MYCROFT_NATIVE_SNAPSHOT_MS, 100 ms) read at the heartbeat:
#   at most one snapshot interval plus one heartbeat interval old when received.

_CONTRACT_TABLE = """
RES_SERVICE_NAME string - | RES_HOST_NAME string - | RES_OS_HOST_NAME string - | RES_PROCESS_PID int -
RES_JOB_ID string - | RES_RANK int rank | RES_WORLD_SIZE int ranks | RES_LOCAL_RANK int rank
RES_SCHEMA_VERSION string - | RES_RUN_ID string - | RES_SLURM_JOB_ID string - | RES_SLURM_STEP_ID string -
RES_LAUNCHER string - | RES_NODE_RANK int node | RES_LOCAL_WORLD_SIZE int ranks | RES_KUBE_NODE_NAME string -
RES_TRACE_BUDGET double spans/s
ATTR_SPAN_KIND string - | ATTR_RANK int rank | ATTR_JOB_ID string - | ATTR_OP string - | ATTR_API string -
ATTR_SOURCE string - | ATTR_GROUP_ID string - | ATTR_GROUP_NAME string - | ATTR_GROUP_DESC string -
ATTR_GROUP_SIZE int ranks | ATTR_GROUP_RANKS string ranks | ATTR_GROUP_RANK int rank | ATTR_SEQ int seq
ATTR_BYTES int bytes | ATTR_DTYPE string - | ATTR_PEER int rank | ATTR_P2P_SRC int rank | ATTR_P2P_DST int rank
ATTR_ROOT int rank | ATTR_REDUCE_OP string - | ATTR_BACKEND string - | ATTR_ASYNC bool - | ATTR_STATE string -
ATTR_ERROR string - | ATTR_TIMING string - | ATTR_CALL_S double s | ATTR_END_WINDOW_S double s
ATTR_SAMPLE_PROBABILITY double probability
ATTR_HB_PHASE string - | ATTR_HB_PHASE_S double s | ATTR_HB_COUNTER int count | ATTR_HB_INTERVAL_S double s
ATTR_HB_FINAL bool - | ATTR_HB_EXIT_REASON string - | ATTR_HB_IDLE_S double s | ATTR_HB_POSTED_ONLY bool -
ATTR_HB_STACK string - | ATTR_HB_THREAD_STACKS string - | ATTR_HB_DROPPED int records
ATTR_HB_SPANS_KEPT int spans | ATTR_HB_SPANS_ANOMALIES int spans | ATTR_HB_SPANS_SAMPLED_OUT int spans
ATTR_HB_FR_BUILT int spans | ATTR_HB_FR_LOST int collectives | ATTR_HB_FR_DUMP_S double s | ATTR_HB_STEP int step
ATTR_HB_COMM_S double s | ATTR_HB_OPS_DONE int ops
ATTR_HB_DIGEST_GROUP_IDS string[] - | ATTR_HB_DIGEST_BLOCKS int[] block | ATTR_HB_DIGEST_VALUES int[] hash
ATTR_HB_GROUP_IDS string[] - | ATTR_HB_GROUP_NAMES string[] - | ATTR_HB_GROUP_DESCS string[] -
ATTR_HB_GROUP_SIZES int[] ranks | ATTR_HB_GROUP_RANKS string[] ranks | ATTR_HB_GROUP_ISSUED int[] seq
ATTR_HB_GROUP_COMPLETED int[] seq | ATTR_HB_GROUP_FR_COMPLETED int[] seq
ATTR_HB_INFLIGHT_GROUP_IDS string[] - | ATTR_HB_INFLIGHT_SEQS int[] seq | ATTR_HB_INFLIGHT_OPS string[] -
ATTR_HB_INFLIGHT_AGES_S double[] s | ATTR_HB_INFLIGHT_PEERS int[] rank | ATTR_HB_INFLIGHT_BYTES int[] bytes
ATTR_HB_INFLIGHT_DTYPES string[] - | ATTR_HB_INFLIGHT_RETURNED bool[] -
ATTR_HB_FLOW_COMMS string[] - | ATTR_HB_FLOW_SEQS int[] seq | ATTR_HB_FLOW_CHANNELS int[] channel
ATTR_HB_FLOW_PEERS int[] rank | ATTR_HB_FLOW_SENDS bool[] - | ATTR_HB_FLOW_STEPS int[] steps
ATTR_HB_FLOW_POSTED int[] steps | ATTR_HB_FLOW_GPU_READY int[] steps | ATTR_HB_FLOW_TRANSMITTED int[] steps
ATTR_HB_FLOW_DONE int[] steps | ATTR_HB_FLOW_AGES_S double[] s | ATTR_HB_FLOW_RANKS int[] rank
ATTR_HB_FLOW_PROXY_STATES string[] - | ATTR_HB_FLOW_KCH_COMMS string[] - | ATTR_HB_FLOW_KCH_SEQS int[] seq
ATTR_HB_FLOW_KCH_CHANNELS int[] channel | ATTR_HB_FLOW_KCH_AGES_S double[] s | ATTR_HB_FLOW_NCOLL_COMMS string[] -
ATTR_HB_FLOW_NCOLL_SEQS int[] seq | ATTR_HB_FLOW_NCOLL_FUNCS string[] - | ATTR_HB_FLOW_NCOLL_KERNELS int[] channels
ATTR_HB_FLOW_NCOMM_COMMS string[] - | ATTR_HB_FLOW_NCOMM_DONE_SEQS int[] seq | ATTR_HB_NATIVE_DROPPED int records
ATTR_NCCL_COMM_HASH string - | ATTR_NCCL_FUNC string - | ATTR_NCCL_ALGO string - | ATTR_NCCL_PROTO string -
ATTR_NCCL_CHANNELS int channels | ATTR_NCCL_CHANNEL int channel | ATTR_NCCL_IS_SEND bool - | ATTR_NCCL_STEPS int steps
ATTR_NCCL_CHUNK_SIZE int bytes | ATTR_NCCL_PID int - | ATTR_NCCL_STEP int step | ATTR_FLOW_GPU_READY int steps
ATTR_FLOW_TRANSMITTED int steps | ATTR_FLOW_DONE int steps | ATTR_FLOW_STALL_STATE string - | ATTR_FLOW_POSTED int steps
ATTR_NCCL_PROXY_STATE string - | ATTR_NCCL_PXN bool - | ATTR_NCCL_GPU_START_NS int ns | ATTR_NCCL_GPU_STOP_NS int ns
ATTR_NCCL_USER_TAG int - | ATTR_NCCL_SYMMETRIC bool - | ATTR_NCCL_KERNEL_VARIANT string - | ATTR_NCCL_COPY_ENGINE bool -
ATTR_NCCL_KERNEL_PHASE string - | ATTR_NCCL_STALE bool -
ATTR_AGENT_RDZV_BACKEND string - | ATTR_AGENT_NODES_MIN int nodes | ATTR_AGENT_NODES_MAX int nodes
ATTR_AGENT_NODES_JOINED int nodes | ATTR_AGENT_JOINED_HOSTS string[] - | ATTR_AGENT_EXPECTED_HOSTS string[] -
ATTR_SUM_RANKS int[] rank | ATTR_SUM_MISSING_RANKS int[] rank | ATTR_SUM_EXPECTED int ranks | ATTR_SUM_COMPLETE bool -
ATTR_SUM_FIRST_RANK int rank | ATTR_SUM_LAST_RANK int rank | ATTR_SUM_ARRIVAL_SKEW_S double s
ATTR_SUM_DURATION_MIN_S double s | ATTR_SUM_DURATION_MAX_S double s | ATTR_SUM_DURATION_SPREAD_S double s
ATTR_SUM_ALGBW_GBPS double GB/s | ATTR_SUM_BUSBW_GBPS double GB/s | ATTR_SUM_ANOMALY string - | ATTR_SUM_FLOWS int flows
ATTR_SUM_ALGO string - | ATTR_SUM_PROTO string - | ATTR_SUM_BUSBW_FACTOR double ratio | ATTR_SUM_EFFECTIVE_S double s
ATTR_SUM_CLOSED string - | ATTR_SUM_ERROR_RANKS int[] rank | ATTR_SUM_DETAIL_SPANS int spans
ATTR_SUM_KEPT_REASON string - | ATTR_FLOW_SUM_RAW_SPANS int spans | ATTR_FLOW_SUM_STEPS int steps
ATTR_FLOW_SUM_STEP_MEAN_S double s | ATTR_FLOW_SUM_STEP_MAX_S double s | ATTR_FLOW_SUM_BYTES int bytes
ATTR_FLOW_SUM_GBPS double GB/s
"""
#: constant name -> (wire type, unit; "" for none)
CONTRACT: Final[dict[str, tuple[str, str]]] = {
    name: (kind, "" if unit == "-" else unit)
    for line in _CONTRACT_TABLE.strip().splitlines() for entry in line.split("|")
    for name, kind, unit in [entry.split()]
}
#: attribute (its wire name) -> (wire type, unit)
CONTRACT_BY_ATTR: Final[dict[str, tuple[str, str]]] = {
    globals()[name]: spec for name, spec in CONTRACT.items() if isinstance(globals().get(name), str)}

_PY_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "int": (int,), "double": (float, int), "bool": (bool,)}


def _conforms(value: object, kind: str) -> bool:
    element = kind.removesuffix("[]")
    allowed = _PY_TYPES.get(element)
    if allowed is None:
        return True
    if kind.endswith("[]"):
        return isinstance(value, list | tuple) and all(
            isinstance(v, allowed) and (element == "bool" or not isinstance(v, bool)) for v in value)
    return isinstance(value, allowed) and (element == "bool" or not isinstance(value, bool))


#: the parallel tables of a heartbeat: every array of a table has the length of its first
HB_TABLES: Final = (
    ("group", ATTR_HB_GROUP_IDS, (ATTR_HB_GROUP_NAMES, ATTR_HB_GROUP_SIZES, ATTR_HB_GROUP_RANKS,
                                  ATTR_HB_GROUP_ISSUED, ATTR_HB_GROUP_COMPLETED, ATTR_HB_GROUP_DESCS,
                                  ATTR_HB_GROUP_FR_COMPLETED)),
    ("inflight", ATTR_HB_INFLIGHT_GROUP_IDS, (ATTR_HB_INFLIGHT_SEQS, ATTR_HB_INFLIGHT_OPS, ATTR_HB_INFLIGHT_AGES_S,
                                              ATTR_HB_INFLIGHT_PEERS, ATTR_HB_INFLIGHT_BYTES, ATTR_HB_INFLIGHT_DTYPES,
                                              ATTR_HB_INFLIGHT_RETURNED)),
    ("flow", ATTR_HB_FLOW_COMMS, (ATTR_HB_FLOW_SEQS, ATTR_HB_FLOW_CHANNELS, ATTR_HB_FLOW_PEERS, ATTR_HB_FLOW_SENDS,
                                  ATTR_HB_FLOW_STEPS, ATTR_HB_FLOW_POSTED, ATTR_HB_FLOW_GPU_READY,
                                  ATTR_HB_FLOW_TRANSMITTED, ATTR_HB_FLOW_DONE, ATTR_HB_FLOW_AGES_S,
                                  ATTR_HB_FLOW_RANKS, ATTR_HB_FLOW_PROXY_STATES)),
)


def contract_problems(attributes: Mapping[str, object], keys: Iterable[str] | None = None) -> list[str]:
    """What in these attributes breaks the typed contract: a value of another type than CONTRACT says,
    a parallel-table array of another length than its table's first. `keys`: check only these."""
    out: list[str] = []
    for key in attributes.keys() if keys is None else keys:
        spec = CONTRACT_BY_ATTR.get(key)
        if spec is None or key not in attributes:
            continue
        if not _conforms(attributes[key], spec[0]):
            out.append(f"{key}: not {spec[0]}")
    wanted = None if keys is None else set(keys)
    for table, lead, rest in HB_TABLES:
        if wanted is not None and wanted.isdisjoint((lead, *rest)):
            continue  # another table than the one asked about
        first = attributes.get(lead)
        if not isinstance(first, list | tuple):
            continue
        for key in rest:
            value = attributes.get(key)
            if value is not None and (not isinstance(value, list | tuple) or len(value) != len(first)):
                out.append(f"{key}: not {len(first)} long like {lead} ({table} table)")
    return out
