"""3D-parallel rank layout (pure): TP x PP x DP grids as Megatron-LM lays them out.

Megatron's default order is tp-dp-pp with tensor parallelism fastest: global rank
`r = tp + TP * (dp + DP * pp)`. Ranks of one tensor-parallel group are neighbours (one
node's NVLink domain in production), a pipeline stage is `TP * DP` consecutive ranks, and
each pipeline group links the same (tp, dp) position across stages.

Both the torchrun job (to create its process groups) and the harness (to pick a faulty
rank a fault makes sense on) use this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Coord:
    tp: int
    pp: int
    dp: int


@dataclass(frozen=True, slots=True)
class Layout:
    tp: int = 2
    pp: int = 2
    dp: int = 2

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp) < 1:
            raise ValueError(f"TP, PP and DP must be >= 1, got {self.tp}x{self.pp}x{self.dp}")

    @classmethod
    def parse(cls, text: str) -> Layout:
        """'2x2x2' (TP x PP x DP)."""
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"layout {text!r}: want TPxPPxDP, e.g. 2x2x2")
        return cls(*(int(p) for p in parts))

    def __str__(self) -> str:
        return f"{self.tp}x{self.pp}x{self.dp}"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, c: Coord) -> int:
        return c.tp + self.tp * (c.dp + self.dp * c.pp)

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside a world of {self.world}")
        return Coord(tp=rank % self.tp, dp=rank // self.tp % self.dp, pp=rank // (self.tp * self.dp))

    def tp_groups(self) -> list[list[int]]:
        return [[self.rank(Coord(t, p, d)) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [[self.rank(Coord(t, p, d)) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        return [[self.rank(Coord(t, p, d)) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def group_of(self, kind: str, rank: int) -> list[int]:
        """The members of `rank`'s tp / dp / pp group."""
        groups = {"tp": self.tp_groups, "dp": self.dp_groups, "pp": self.pp_groups}[kind]()
        return next(g for g in groups if rank in g)

    def next_stage(self, rank: int) -> int | None:
        c = self.coord(rank)
        return None if c.pp == self.pp - 1 else self.rank(Coord(c.tp, c.pp + 1, c.dp))

    def prev_stage(self, rank: int) -> int | None:
        c = self.coord(rank)
        return None if c.pp == 0 else self.rank(Coord(c.tp, c.pp - 1, c.dp))


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """Megatron's non-interleaved 1F1B schedule of one stage as (action, micro-batch) pairs.

    Actions: "recv_fwd", "fwd", "send_fwd", "send_fwd_recv_bwd", "bwd", "send_bwd",
    "send_bwd_recv_fwd", "recv_bwd". Point-to-point actions at the first / last stage
    (no neighbour on that side) are left out. The combined actions are one exchange with a
    neighbour: the lower stage sends first, the upper stage receives first, so blocking
    send/recv never wait on each other (swapping one side's order is the p2p deadlock).
    """
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, micro_batches)
    remaining = micro_batches - warmup
    out: list[tuple[str, int]] = []
    for mb in range(warmup):
        if not first:
            out.append(("recv_fwd", mb))
        out.append(("fwd", mb))
        if not last:
            out.append(("send_fwd", mb))
    if remaining and not first:
        out.append(("recv_fwd", warmup))
    for i in range(remaining):
        fwd_mb, bwd_mb = warmup + i, i
        out.append(("fwd", fwd_mb))
        if not last:
            out.append(("send_fwd_recv_bwd", fwd_mb))  # sends fwd_mb's activation, receives bwd_mb's gradient
        out.append(("bwd", bwd_mb))
        if i == remaining - 1:
            if not first:
                out.append(("send_bwd", bwd_mb))
        elif not first:
            out.append(("send_bwd_recv_fwd", bwd_mb))  # sends bwd_mb's gradient, receives fwd_mb + 1's input
    for i in range(warmup):
        bwd_mb = remaining + i
        if not last:
            out.append(("recv_bwd", bwd_mb))
        out.append(("bwd", bwd_mb))
        if not first:
            out.append(("send_bwd", bwd_mb))
    return out


def unfit(fault: str, layout: Layout) -> str | None:
    """Why `fault` cannot be injected into a job of this layout (None when it can)."""
    if layout.world < 2:
        return "a one-rank job has no communication"
    if fault == "deadlock" and layout.pp < 2:
        return "the p2p deadlock needs a pipeline (PP >= 2)"
    if fault == "chain" and (layout.tp < 2 or layout.pp * layout.dp < 2):
        return "a chain across groups needs TP >= 2 and PP or DP >= 2"
    if fault.startswith("mismatch") and layout.dp < 2:
        return "the mismatch faults diverge in the DP all_reduce (DP >= 2)"
    return None
