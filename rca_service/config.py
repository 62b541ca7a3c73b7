"""Analysis thresholds in one place, so tests, the service and the CLI agree on them: the numbers, and
the expected phases (pauses.py) with their stack patterns and budgets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Phase:
    """An expected phase, recognised by a regular expression over the holder's stack."""

    name: str
    pattern: str
    budget_s: float
    # when set, the innermost frame must match it too: the rank is inside the library's own
    # machinery, not in user code that the library called (a block in a graph break's eager
    # code runs under torch/_dynamo frames, and is no compilation)
    innermost: str = ""
    # a frame matching it is not this phase even when the pattern matches (activation checkpointing's
    # recompute is no checkpoint save)
    unless: str = ""


COMPILATION = "compilation"  # the phase a rank that reports it is compiling (schema.PHASE_COMPILING) is in


# library code, or code a library generated and runs (FX's `<eval_with_key>.N`, dataclasses' and
# namedtuple's exec'd `<string>`): no user file, so no block the user wrote
_LIBRARY_FRAME = r"site-packages/|dist-packages/|<frozen |/lib/python3\.\d+/|^<eval_with_key>|^<string>:"

# Defaults: frames of the usual libraries and the usual names. The budget is how long
# such a pause may last before it pages someone.
DEFAULT_PHASES: tuple[Phase, ...] = (
    Phase("checkpoint", r"checkpoint|ckpt|torch/serialization\.py|safetensors|in save(_\w+)?$|"
                        r"in _?save_state|in write_(state|shard)", 600.0,
          unless=r"torch/utils/checkpoint\.py|checkpoint_wrapper|activation_checkpointing|tensor_parallel/random\.py|"
                 r"in (checkpointed_forward|_checkpointed_forward|recompute\w*|CheckpointFunction\w*)$"),
    Phase("evaluation", r"in _?(eval|evaluate|evaluation|validate|validation|val_step|eval_step|test_step)"
                        r"(_\w+)?$", 600.0),
    Phase("data loading", r"torch/utils/data/|dataloader|in _?(load|next|fetch|get|prefetch)_?\w*batch\w*$|"
                          r"in __next__$", 120.0),
    # the first steps of a compiled model: ranks compile (or run a freshly compiled graph's
    # wrappers) at different speeds, minutes for a large model, while their peers wait
    Phase(COMPILATION, r"torch/_dynamo/|torch/_inductor/|torch/_functorch/|torch/fx/|triton/compiler", 900.0,
          innermost=_LIBRARY_FRAME),
    # torch imports much lazily on first use (DTensor's op strategies, inductor's passes)
    Phase("importing", r"<frozen importlib\._bootstrap", 300.0, innermost=_LIBRARY_FRAME),
    # a framework setting the job up after its first collectives (engine, optimizer, config dump, groups):
    # ranks leave it seconds apart on a loaded host while the fastest waits in the next collective
    Phase("setup", r"deepspeed/__init__\.py:\d+ in initialize$|accelerate/accelerator\.py:\d+ in prepare\w*$|"
                   r"megatron/core/parallel_state\.py:\d+ in initialize_model_parallel$|"
                   r"megatron/training/initialize\.py:\d+ in initialize_megatron$|"
                   r"torchtitan/train\.py:\d+ in __init__$",
          300.0, innermost=_LIBRARY_FRAME),
)


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    """Knobs of the pure analysis. Defaults aim at seconds-level detection without false alarms."""

    # hang: an op in flight longer than max(hang_min_s, hang_factor * recent p95 op time)
    hang_min_s: float = 1.0
    hang_factor: float = 6.0
    hang_max_s: float = 120.0
    # a group's first collectives do not teach that p95: they wait for ranks still arriving, compiling or
    # setting up communicators (a compiled TP job whose only Python-timed ops were its start-up ones
    # learned a 2.5 s threshold from them and named its blocked rank after 2.6-2.9 s instead of ~1 s)
    hang_warmup_seqs: int = 16
    # start-up: ranks waiting in rendezvous (init_process_group) for ranks that are not there name
    # those (a warning) once the wait lasts max(startup_min_s, startup_spread_factor * the spread of
    # the waiting ranks' arrivals): ranks that arrived together and then wait name the absent one in
    # a second; a large job whose ranks trickle in over many seconds waits in proportion.
    # Critical once the wait exceeds startup_budget_s
    startup_min_s: float = 1.0
    startup_spread_factor: float = 2.0
    startup_budget_s: float = 60.0
    # a multi-node launch: the nodes' launcher agents (torchrun) wait for the job's other nodes before
    # any rank exists (instrumentation/agent.py). The absent nodes are named as ranks are above; critical
    # once the wait exceeds node_rendezvous_budget_s (nodes are scheduled, booted, pull images minutes
    # apart; torchrun itself gives up after 15 minutes)
    node_rendezvous_budget_s: float = 300.0
    # ... and named (a warning) once the wait lasts node_rendezvous_min_s, or startup_spread_factor times
    # the spread of the agents' arrivals: nodes start seconds apart where ranks of one node do not
    node_rendezvous_min_s: float = 5.0
    # ... and a holder that never completed a collective is still starting while its stack moves; one
    # whose stack stood still this many heartbeat intervals is stuck there (paged as at any other time)
    startup_still_intervals: float = 2.5
    # lost heartbeats: silent for lost_intervals * interval + lost_slack_s
    lost_intervals: float = 2.5
    lost_slack_s: float = 0.3
    # a rank others wait on: suspect after this many missed intervals (verdict deferred),
    # convicted as lost after corroborated_lost_intervals (its peers' hang corroborates)
    suspect_intervals: float = 1.2
    corroborated_lost_intervals: float = 2.0
    suspect_slack_s: float = 0.15
    # stall: nothing in flight, nothing completing, for max(stall_min_s, stall_factor * interval)
    stall_min_s: float = 30.0
    stall_factor: float = 20.0
    # slowdown: recent median interval vs baseline median interval
    slow_ratio: float = 1.6
    slow_min_delta_s: float = 0.01
    slow_window: int = 8
    slow_baseline_min: int = 8
    # straggler: same rank last to arrive in >= this share of the window
    straggler_share: float = 0.75
    # lag-only straggler (no baseline shift needed): stricter
    straggler_lag_only_share: float = 0.9
    straggler_lag_only_window: int = 16
    straggler_lag_only_fraction: float = 0.5  # lag >= fraction * median interval
    # stragglers by compute share (slowness.py): recent heartbeats vs the baseline before them
    slow_recent_beats: int = 6
    slow_base_beats: int = 8  # at most
    slow_base_min_beats: int = 3  # the onset rule needs this many baseline intervals
    imbalance_beats: int = 8
    straggle_min_growth: float = 0.10  # compute share up this much more than the others' (which fall)
    straggle_min_slowdown: float = 1.05  # and the job completes ops at least this much slower
    straggle_persistence: float = 0.8  # in this share of the recent intervals
    # a strong onset is named from a shorter window (every interval must show it)
    straggle_fast_beats: int = 3
    straggle_fast_growth: float = 0.20
    straggle_fast_slowdown: float = 1.15
    # a slow link in a moving ring (slow_links.py): one rank's flows hold a backlog at its own
    # NIC / PCIe / proxy in each of its last sampled heartbeats while the job runs slower
    slow_link_beats: int = 3
    slow_link_min_steps: int = 2  # steps held, and this many more than the ring's others at most
    slow_link_min_idle_s: float = 0.02  # proxy: nothing pending, nothing moving for this long
    slow_link_factor: float = 4.0  # ... and this many times the others' idle time
    slow_link_min_slowdown: float = 1.15
    # ... or, with no slowdown against a baseline (slow from the job's start), in each of this many
    # sampled heartbeats and this many times what any other rank holds there
    slow_link_alone_beats: int = 6
    slow_link_alone_factor: float = 2.0
    slow_baseline_hold_s: float = 600.0  # the job's pace before a slowdown is its baseline this long (at most)
    comm_min_wait_growth: float = 0.08  # a transport slowdown: the ranks' wait share up this much
    imbalance_min_excess: float = 0.05  # compute share above the same-work peers' median
    straggle_warning_slowdown: float = 1.15  # job op rate down this much: a warning, else info
    straggle_warning_spread: float = 0.15  # ... with this spread in every recent interval
    imbalance_warning_excess: float = 0.15
    # a condition must clear for this long before its incident resolves
    resolve_after_s: float = 3.0
    # normal pauses (pauses.py): expected phases by stack pattern, each with its budget; pauses
    # this job made before and resumed from get learned_pause_factor x the longest one (clamped);
    # pause_budget_s > 0 makes any not-entered holder a pause for that long
    phases: tuple[Phase, ...] = DEFAULT_PHASES
    pause_budget_s: float = 0.0
    learned_pause_factor: float = 3.0
    learned_pause_min_s: float = 10.0
    learned_pause_max_s: float = 600.0
    # a holder that falls silent while its last stack was in an expected phase (a checkpoint holding the
    # GIL starves the heartbeat thread): a warning until silent this long, then critical
    paused_silence_grace_s: float = 10.0
    # a rank silent without a final heartbeat while no rank waits on anything and none exited: a warning
    # until silent this long (load starves heartbeat threads for a second or two); a frozen rank's peers
    # soon wait on it (a hang, critical), a killed rank's launcher tears the job down (exits, critical)
    unwaited_lost_grace_s: float = 5.0
    # frames of torch.distributed's process-group setup: a rank whose stack is in one waits for the
    # members of the group it creates (a rendezvous the spans do not show), not a root cause itself
    setup_frames: tuple[str, ...] = (" in new_group", " in new_subgroups", " in init_process_group",
                                     " in _new_process_group_helper", " in _store_based_barrier",
                                     " in init_device_mesh", " in new_subgroups_by_enumeration")
    # a not-entered holder without a stack yet: the hang stays a warning until its stack arrives,
    # or until it has been idle this long plus one heartbeat interval (no stack is coming)
    stack_wait_s: float = 1.0
    # a not-entered holder outside communication for less than this, at a stack where the job does not
    # pause, is a warning: a step slowed by load reads the same for a second; critical if it stays out
    page_idle_min_s: float = 2.0
    # a not-entered rank whose stack moves and that has been outside communication for less than this many
    # times its usual longest stretch outside it (a step's compute) is late, not a cause (verdict._late_why)
    late_step_factor: float = 2.0
    # incidents that fire while an earlier critical one of the job is open (or resolved less than
    # this long ago) and name only lost / exited ranks are its consequences (teardown, aborted peers)
    consequence_window_s: float = 120.0
    # bounded memory
    max_seqs_per_group: int = 256
    max_groups_per_job: int = 4096
    max_ranks_per_job: int = 131072
    max_stack_chars: int = 4000
    job_ttl_s: float = 3600.0
    max_jobs: int = 256
