"""What each wrapped torch.distributed entry point means: a declarative table.

Argument positions are read straight from (args, kwargs) on the hot path; binding
with inspect.signature would cost ~5 us per call. A test checks every position
against the installed torch's real signatures.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycroft import schema

ArgRef = tuple[int, str]  # (position, keyword); position -1 = keyword only
NO_ARG: ArgRef = (-1, "")


@dataclass(frozen=True, slots=True)
class OpSpec:
    api: str  # attribute name in its module
    op: str  # schema.OP_*
    payload: ArgRef  # tensor (or list of tensors) whose bytes we report
    group: ArgRef
    async_op: ArgRef = NO_ARG  # NO_ARG: always synchronous (unless `always_async`)
    peer: ArgRef = NO_ARG  # p2p peer (global rank)
    group_peer: ArgRef = NO_ARG  # p2p peer given as a group rank
    root: ArgRef = NO_ARG  # rooted collectives: src / dst (global rank)
    group_root: ArgRef = NO_ARG
    reduce_op: ArgRef = NO_ARG
    always_async: bool = False
    is_send: bool = False
    # torch issues one collective per bucket from C++ (DDP's buffer broadcast: one per dtype), all
    # done when the sync call returns: the call covers every seq the group advanced by
    issues_many: bool = False
    is_p2p: bool = False  # derived from op in __post_init__: a plain field is cheaper on the hot path

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_p2p", self.op in schema.P2P_OPS)


# torch.distributed (distributed_c10d) public API
C10D_SPECS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", schema.OP_ALL_REDUCE, (0, "tensor"), (2, "group"), (3, "async_op"),
           reduce_op=(1, "op")),
    OpSpec("all_gather", schema.OP_ALL_GATHER, (1, "tensor"), (2, "group"), (3, "async_op")),
    OpSpec("all_gather_into_tensor", schema.OP_ALL_GATHER, (1, "input_tensor"), (2, "group"), (3, "async_op")),
    OpSpec("all_gather_single", schema.OP_ALL_GATHER, (1, "input_tensor"), (2, "group"), (3, "async_op")),
    OpSpec("reduce_scatter", schema.OP_REDUCE_SCATTER, (1, "input_list"), (3, "group"), (4, "async_op"),
           reduce_op=(2, "op")),
    OpSpec("reduce_scatter_tensor", schema.OP_REDUCE_SCATTER, (1, "input"), (3, "group"), (4, "async_op"),
           reduce_op=(2, "op")),
    OpSpec("reduce_scatter_single", schema.OP_REDUCE_SCATTER, (1, "input"), (3, "group"), (4, "async_op"),
           reduce_op=(2, "op")),
    OpSpec("broadcast", schema.OP_BROADCAST, (0, "tensor"), (2, "group"), (3, "async_op"),
           root=(1, "src"), group_root=(4, "group_src")),
    OpSpec("reduce", schema.OP_REDUCE, (0, "tensor"), (3, "group"), (4, "async_op"),
           root=(1, "dst"), group_root=(5, "group_dst"), reduce_op=(2, "op")),
    OpSpec("gather", schema.OP_GATHER, (0, "tensor"), (3, "group"), (4, "async_op"),
           root=(2, "dst"), group_root=(5, "group_dst")),
    # payload: the output chunk, which every rank has (non-source ranks pass no scatter_list), so the
    # signature (op, bytes, dtype) is the same on every member
    OpSpec("scatter", schema.OP_SCATTER, (0, "tensor"), (3, "group"), (4, "async_op"),
           root=(2, "src"), group_root=(5, "group_src")),
    OpSpec("all_to_all", schema.OP_ALL_TO_ALL, (1, "input_tensor_list"), (2, "group"), (3, "async_op")),
    OpSpec("all_to_all_single", schema.OP_ALL_TO_ALL, (1, "input"), (4, "group"), (5, "async_op")),
    OpSpec("barrier", schema.OP_BARRIER, NO_ARG, (0, "group"), (1, "async_op")),
    OpSpec("monitored_barrier", schema.OP_BARRIER, NO_ARG, (0, "group")),
    OpSpec("send", schema.OP_SEND, (0, "tensor"), (2, "group"), peer=(1, "dst"), group_peer=(4, "group_dst"),
           is_send=True),
    OpSpec("recv", schema.OP_RECV, (0, "tensor"), (2, "group"), peer=(1, "src"), group_peer=(4, "group_src")),
    OpSpec("isend", schema.OP_SEND, (0, "tensor"), (2, "group"), peer=(1, "dst"), group_peer=(4, "group_dst"),
           always_async=True, is_send=True),
    OpSpec("irecv", schema.OP_RECV, (0, "tensor"), (2, "group"), peer=(1, "src"), group_peer=(4, "group_src"),
           always_async=True),
    # one C++ collective each (one seq); async: all_reduce_coalesced returns a Future, not a Work
    OpSpec("all_reduce_coalesced", schema.OP_ALL_REDUCE, (0, "tensors"), (2, "group"), (3, "async_op"),
           reduce_op=(1, "op")),
    OpSpec("all_gather_coalesced", schema.OP_ALL_GATHER, (1, "input_tensor_list"), (2, "group"), (3, "async_op")),
)

# torch.distributed only (C++ functions): DDP's parameter broadcast at construction and its
# per-forward buffer broadcast. Several broadcasts of at most buffer_size bytes each: the op is
# recorded once, with the seq of the first; its return covers the rest (issues_many). DDP's
# check at construction that every rank holds the same parameter shapes: an all-gather of
# their metadata (no payload of ours: the parameters are not what it sends). Ranks wait there for
# peers still importing or building their model: in flight from the call on, not from the next
# Flight Recorder read, so they do not read as outside communication meanwhile.
C10D_ONLY_IN_DIST: tuple[OpSpec, ...] = (
    OpSpec("_broadcast_coalesced", schema.OP_BROADCAST, (1, ""), (0, ""), group_root=(3, ""), issues_many=True),
    OpSpec("_verify_params_across_processes", schema.OP_ALL_GATHER, NO_ARG, (0, ""), issues_many=True),
)

# _coalescing_manager: the block's ops, by the function torch recorded for each, are one collective
COALESCED_OPS: dict[str, str] = {
    "all_reduce": schema.OP_ALL_REDUCE,
    "all_gather_into_tensor": schema.OP_ALL_GATHER,
    "all_gather_single": schema.OP_ALL_GATHER,
    "reduce_scatter_tensor": schema.OP_REDUCE_SCATTER,
    "reduce_scatter_single": schema.OP_REDUCE_SCATTER,
}

# torch.distributed._functional_collectives (DTensor, torch.compile-friendly API).
# The group argument may be a ProcessGroup, a group name, a DeviceMesh or (mesh, dim).
# Completion is observed in funcol.wait_tensor.
FUNCOL_SPECS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", schema.OP_ALL_REDUCE, (0, "self"), (2, "group"), reduce_op=(1, "reduceOp"),
           always_async=True),
    OpSpec("broadcast", schema.OP_BROADCAST, (0, "self"), (2, "group"), root=(1, "src"), always_async=True),
    OpSpec("all_gather_single", schema.OP_ALL_GATHER, (0, "self"), (2, "group"), always_async=True),
    OpSpec("all_gather_tensor", schema.OP_ALL_GATHER, (0, "self"), (2, "group"), always_async=True),
    OpSpec("reduce_scatter_single", schema.OP_REDUCE_SCATTER, (0, "self"), (3, "group"),
           reduce_op=(1, "reduceOp"), always_async=True),
    OpSpec("reduce_scatter_tensor", schema.OP_REDUCE_SCATTER, (0, "self"), (3, "group"),
           reduce_op=(1, "reduceOp"), always_async=True),
    OpSpec("all_to_all_single", schema.OP_ALL_TO_ALL, (0, "self"), (3, "group"), always_async=True),
)


def arg(args: tuple[object, ...], kwargs: dict[str, object], ref: ArgRef, default: object = None) -> object:
    """Fetch one argument by position or keyword without binding the whole signature."""
    position, keyword = ref
    if 0 <= position < len(args):
        return args[position]
    if keyword:
        return kwargs.get(keyword, default)
    return default
