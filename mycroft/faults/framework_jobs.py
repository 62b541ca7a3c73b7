"""Tiny training jobs in the style of each framework, on gloo/CPU, that can hang one rank.

    opentelemetry-instrument torchrun --nproc-per-node 4 -m mycroft.faults.framework_jobs --framework ddp
    opentelemetry-instrument python -m torch.distributed.run --nproc-per-node 4 -m mycroft.faults.framework_jobs ...
    opentelemetry-instrument python -m mycroft.faults.framework_jobs --spawn 4 --framework fsdp2   # mp.spawn, env://
    srun -n 4 opentelemetry-instrument python -m mycroft.faults.framework_jobs ...   # SLURM_PROCID / _NTASKS
    torchrun --nproc-per-node 4 -m mycroft.faults.framework_jobs --in-code ...    # mycroft.instrumentation.start()

Each framework is a small class: `setup()` builds the model and its parallelism the way the
framework does (its own torch APIs, so the collectives come from the issuers a real job has),
`step()` runs one training step and calls `point(name)` at the fault points:

  before_forward   before the forward pass
  between_fwd_bwd  after the forward, before the backward (pipelines: in the stage's first
                   backward of the step, from a hook on its output, i.e. after its forwards)
  before_step      after the backward, before the optimizer step

Frameworks, and what issues their collectives:

- ddp: DDP over Linear + BatchNorm1d + Linear: init broadcast and every forward's buffer
  broadcast (C++ `_broadcast_coalesced`), bucket all-reduce from the C++ reducer
- ddp_unused: DDP(find_unused_parameters=True), a head used every other step: + the unused-map
  all-reduce
- fsdp2: fully_shard per layer + root on a 1-D mesh: all_gather_single / reduce_scatter (sum
  reduction: gloo has no ReduceOp.AVG)
- fsdp2_hsdp: fully_shard on a 2x2 (replicate, shard) mesh: + the replicate all_reduce
- fsdp2_prefetch: fsdp2 with explicit forward / backward prefetch (async all-gathers)
- fsdp1: FullyShardedDataParallel (the FSDP1 API, still what many trainers wrap with), one unit
  per Linear on the CPU (`device_id=cpu`): its Python `_all_gather_base` / `_reduce_scatter_base`
  calls (all_gather_into_tensor / reduce_scatter_tensor), with FSDP1's default backward prefetch
- tp_eager: DTensor parallelize_module, ColwiseParallel + RowwiseParallel, 1-D "tp" mesh (funcol)
- tp_compiled: tp_eager under torch.compile (`--compile-backend`, default aot_eager)
- compile_fullgraph: torch.compile(fullgraph=True): a funcol all_reduce in forward, an
  all_gather_tensor_autograd whose backward reduce-scatters
- pipe_gpipe, pipe_1f1b: torch.distributed.pipelining, one stage per rank, 4 micro-batches
- pipe_interleaved: ScheduleInterleaved1F1B, two stages per rank (looped)
- pipe_zbv: ScheduleZBVZeroBubble, two stages per rank (V shape)
- megatron_coalescing: Megatron's groups (`group_desc` TENSOR_MODEL_PARALLEL_GROUP /
  DATA_PARALLEL_GROUP), a TP all_reduce, the grads reduce-scattered and the params all-gathered
  inside `_coalescing_manager(group, async_ops=True)` + `cm.wait()`
- deepspeed_coalesced: `all_reduce_coalesced` of the grads, `all_gather_coalesced` of the shards
- dcp: grads all-reduced by hand; torch.distributed.checkpoint save every 2 steps, load every 4
- mesh2d: init_device_mesh (2, 2) (dp_shard, tp) + the flattened dp_shard_tp dim: a collective
  on each dim
- startup: ddp, but the faulty rank blocks BEFORE init_process_group: the others wait in rendezvous

Options: --framework, --steps, --seed, --fault {none,block}, --fault-rank, --fault-step N and
--warmup-s S (the block strikes in the N-th step that begins at least S seconds after the first
step ended: the harness lets a job get past its start-up transient, where exporters connect,
compiled code compiles and the ranks drift apart, before it blocks a rank; default S = 0, N-th
step of the job), --fault-point {before_forward,between_fwd_bwd,before_step,any}, --onset-file
PATH (the faulty
rank writes {"fault", "rank", "step", "position", "onset", ...} just before it blocks, as
mycroft/faults/inject.py reads it), --loss-file PATH (the rank holding the loss writes the final
loss: rank 0, or the last stage's holder for pipelines), --graph-breaks-file PATH (rank 0 writes
torch._dynamo's graph-break count), --compile-backend, --spawn N, --in-code.
A block sleeps forever in `stuck_in_user_code()`.

Ranks come from torchrun's RANK / WORLD_SIZE / LOCAL_RANK, else SLURM_PROCID / SLURM_NTASKS /
SLURM_LOCALID (MASTER_ADDR / MASTER_PORT from the caller); `--spawn N` sets them per worker.
Every framework here runs on torch 2.13 CPU + gloo with 4 ranks (mesh2d, fsdp2_hsdp and
megatron_coalescing need exactly 4; pipe_* need >= 2), checked uninstrumented; FSDP2 needs
set_force_sum_reduction_for_comms(True) on gloo (no ReduceOp.AVG). The compiled variants default
to backend aot_eager (compiles in seconds); `--compile-backend inductor` runs too (about a
minute of compiling per rank on the 2-core VM). What is not exercised here: CUDA-only paths
(async TP / symmetric memory, DTensor's shard_dim_alltoall, NCCL's coalesced Works).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .job3d import write_onset

POINTS = ("before_forward", "between_fwd_bwd", "before_step")
FAULTS = ("none", "block")
DIM = 16
BATCH = 8


def stuck_in_user_code() -> None:
    """The injected hang: the rank sits here forever (the stack in its heartbeats says so)."""
    while True:
        time.sleep(1.0)


class Ctx:
    """One rank's run: its identity, its data, and the fault plan."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        self.args, self.rank, self.world = args, rank, world
        self.step = 0
        self.faulty = args.fault == "block" and rank == args.fault_rank
        point = args.fault_point
        if point == "any":  # drawn from the seed, so a run can be repeated
            point = random.Random(args.seed * 7919 + 17).choice(POINTS)
        self.point_name = point
        self.fired = False
        self.first_step_at: float | None = None
        self.warm_from: float | None = None  # when the first step ended
        self.warm_step: int | None = None  # the first step that began after the warm-up

    def begin_step(self, step: int) -> None:
        """Step `step` begins. The warm-up runs from the end of the first step (compiled code has
        compiled by then), so fault steps count from the first step that begins --warmup-s later."""
        self.step = step
        now = time.time()
        if self.first_step_at is None:
            self.first_step_at = now
        if self.args.warmup_s <= 0:
            self.warm_step = 1
        elif step >= 2 and self.warm_from is None:
            self.warm_from = now
        if self.warm_step is None and self.warm_from is not None and now - self.warm_from >= self.args.warmup_s:
            self.warm_step = step

    @property
    def fault_step(self) -> int | None:
        """The step the fault strikes in: the --fault-step'th after the warm-up (1 = its first step)."""
        return None if self.warm_step is None else self.warm_step + self.args.fault_step - 1

    def point(self, name: str) -> None:
        """A fault point of the step: the faulty rank blocks here at its step."""
        if not self.faulty or self.fired or self.step != self.fault_step or name != self.point_name:
            return
        self.block(name)

    def block(self, position: str) -> None:
        self.fired = True
        since = None if self.first_step_at is None else round(time.time() - self.first_step_at, 3)
        write_onset(self.args.onset_file, fault="block", rank=self.rank, step=self.step, position=position,
                    framework=self.args.framework, after_warmup_step=self.args.fault_step,
                    since_first_step_s=since, first_step_ended=self.warm_from)
        print(f"framework_jobs: rank {self.rank} blocks at step {self.step} {position}", file=sys.stderr, flush=True)
        stuck_in_user_code()

    def batch(self, rows: int = BATCH, out: int = 1, same: bool = False) -> tuple[Any, Any]:
        """This step's (input, target): per rank, or the same on every rank (`same`: TP, pipelines)."""
        import torch

        g = torch.Generator().manual_seed(self.args.seed * 100_003 + self.step * 101 + (0 if same else self.rank + 1))
        return torch.randn(rows, DIM, generator=g), torch.randn(rows, out, generator=g)


def _mlp(width: int = 32, out: int = 1, bn: bool = False) -> Any:
    import torch.nn as nn

    layers: list[Any] = [nn.Linear(DIM, width)]
    if bn:
        layers.append(nn.BatchNorm1d(width))
    layers += [nn.ReLU(), nn.Linear(width, out)]
    return nn.Sequential(*layers)


class Framework:
    """A model, its parallelism and one training step."""

    loss_rank = 0  # the rank whose loss is reported
    model: Any
    opt: Any

    def __init__(self, ctx: Ctx) -> None:
        import torch
        import torch.distributed as dist

        self.ctx, self.torch, self.dist = ctx, torch, dist

    def setup(self) -> None:
        raise NotImplementedError

    def step(self) -> float:
        """One step of `self.model` on a batch, mean squared error (what FSDP1 / FSDP2 do; others override)."""
        x, y = self.ctx.batch()
        return self._train(lambda: self.torch.nn.functional.mse_loss(self.model(x), y))

    def rewrap(self) -> None:
        """The instrumentation was switched on or off (--ab-block): redo what it hooks at construction."""

    def params_sum(self) -> float:
        total = 0.0
        for p in self.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            total += float(local.detach().double().abs().sum())
        return total

    def _train(self, forward: Callable[[], Any]) -> float:
        """The generic step: forward -> loss, backward, optimizer step, with the three points."""
        ctx = self.ctx
        ctx.point("before_forward")
        loss = forward()
        ctx.point("between_fwd_bwd")
        loss.backward()
        ctx.point("before_step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


# ---------------------------------------------------------------------------------------------- DDP
def _two_heads(with_b: bool) -> Any:
    import torch
    import torch.nn as nn

    class TwoHeads(nn.Module):
        """Linear + BatchNorm1d + Linear (buffers: DDP broadcasts them every forward), and a
        second head only some steps use (find_unused_parameters)."""

        def __init__(self) -> None:
            super().__init__()
            self.a = _mlp(bn=True)
            self.b = nn.Linear(DIM, 1) if with_b else None

        def forward(self, x: torch.Tensor, use_b: bool = False) -> torch.Tensor:
            return self.b(x) if use_b and self.b is not None else self.a(x)

    return TwoHeads()


class Ddp(Framework):
    find_unused = False

    def setup(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.model = DDP(_two_heads(self.find_unused), find_unused_parameters=self.find_unused)
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)

    def rewrap(self) -> None:
        """A new DDP around the same module: its comm hook (or none) follows the instrumentation."""
        import gc

        from torch.nn.parallel import DistributedDataParallel as DDP

        module = self.model.module
        self.model = None
        gc.collect()  # the old reducer removes its autograd hooks when it goes
        self.model = DDP(module, find_unused_parameters=self.find_unused)

    def step(self) -> float:
        x, y = self.ctx.batch()
        use_b = self.find_unused and self.ctx.step % 2 == 0
        return self._train(lambda: self.torch.nn.functional.mse_loss(self.model(x, use_b=use_b), y))


class DdpUnused(Ddp):
    find_unused = True


# ---------------------------------------------------------------------------------------------- FSDP2
class Fsdp2(Framework):
    mesh_shape: tuple[int, ...] = ()
    prefetch = False

    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if self.mesh_shape:
            mesh = init_device_mesh("cpu", self.mesh_shape, mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (self.ctx.world,), mesh_dim_names=("shard",))
        nn = self.torch.nn
        self.model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        self.layers = [m for m in self.model if isinstance(m, nn.Linear)]
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        for module in (self.model, *self.layers):
            module.set_force_sum_reduction_for_comms(True)  # gloo has no ReduceOp.AVG
        if self.prefetch:
            for i, layer in enumerate(self.layers):
                if i + 1 < len(self.layers):
                    layer.set_modules_to_forward_prefetch([self.layers[i + 1]])
                if i > 0:
                    layer.set_modules_to_backward_prefetch([self.layers[i - 1]])
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)


class Fsdp1(Framework):
    def setup(self) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        nn = self.torch.nn
        model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        self.model = FullyShardedDataParallel(model, device_id=self.torch.device("cpu"), use_orig_params=True,
                                              auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)


class Fsdp2Hsdp(Fsdp2):
    mesh_shape = (2, 2)


class Fsdp2Prefetch(Fsdp2):
    prefetch = True


# ---------------------------------------------------------------------------------------------- DTensor TP
class TpEager(Framework):
    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        nn = self.torch.nn
        mesh = init_device_mesh("cpu", (self.ctx.world,), mesh_dim_names=("tp",))
        block = nn.Sequential(nn.Linear(DIM, 8 * self.ctx.world), nn.ReLU(), nn.Linear(8 * self.ctx.world, DIM))
        self.model = parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        self.forward = self._wrap(self.model)
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)

    def _wrap(self, model: Any) -> Any:
        return model

    def step(self) -> float:
        x, y = self.ctx.batch(out=DIM, same=True)
        return self._train(lambda: self.torch.nn.functional.mse_loss(self.forward(x), y))


class TpCompiled(TpEager):
    def _wrap(self, model: Any) -> Any:
        return self.torch.compile(model, backend=self.ctx.args.compile_backend)


# ---------------------------------------------------------------------------------------------- torch.compile fullgraph
class CompileFullgraph(Framework):
    """One block compiled with fullgraph=True: a functional all_reduce in its forward (a statistic
    over the group) and an all_gather_tensor_autograd whose backward issues a reduce_scatter."""

    def setup(self) -> None:
        import torch
        import torch.distributed._functional_collectives as funcol
        from torch import nn

        group = self.dist.group.WORLD
        world = self.ctx.world

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = nn.Linear(DIM, DIM)
                self.head = nn.Linear(DIM, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                h = torch.relu(self.inner(x))
                scale = funcol.all_reduce(h.detach().pow(2).mean().reshape(1), "sum", group)  # forward collective
                h = h / torch.sqrt(scale / world + 1.0)
                full = funcol.all_gather_tensor_autograd(h, 0, group)  # backward: reduce_scatter
                return self.head(full)

        self.model = Block()
        self.forward = torch.compile(self.model, backend=self.ctx.args.compile_backend, fullgraph=True)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def step(self) -> float:
        x, _ = self.ctx.batch()
        # the target of the gathered batch: every rank's rows, in rank order
        ys = []
        for r in range(self.ctx.world):
            g = self.torch.Generator().manual_seed(self.ctx.args.seed * 100_003 + self.ctx.step * 101 + r + 7)
            ys.append(self.torch.randn(BATCH, 1, generator=g))
        y = self.torch.cat(ys)
        return self._train(lambda: self.torch.nn.functional.mse_loss(self.forward(x), y))


# ---------------------------------------------------------------------------------------------- pipelining
class Pipe(Framework):
    schedule_name = "ScheduleGPipe"
    stages_per_rank = 1
    v_shape = False
    microbatches = 4

    def setup(self) -> None:
        import torch
        import torch.distributed.pipelining as pipelining
        from torch import nn
        from torch.distributed.pipelining import PipelineStage

        world, rank = self.ctx.world, self.ctx.rank
        n_stages = world * self.stages_per_rank
        if self.v_shape:
            indices = [rank, 2 * world - 1 - rank]
        else:
            indices = [rank + k * world for k in range(self.stages_per_rank)]
        # every rank builds the whole model from the seed and keeps its stages
        torch.manual_seed(self.ctx.args.seed)
        full = [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(n_stages)]
        self.mods = [full[i] for i in indices]
        for mod in self.mods:
            mod.register_forward_hook(self._output_hook)
        self.model = nn.ModuleList(self.mods)
        stages = [PipelineStage(full[i], i, n_stages, torch.device("cpu")) for i in indices]
        cls = getattr(pipelining, self.schedule_name)

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(out, target)

        self.first = 0 in indices
        self.last = n_stages - 1 in indices
        self.loss_rank = 0 if self.v_shape else (n_stages - 1) % world
        if self.stages_per_rank == 1:
            self.schedule = cls(stages[0], self.microbatches, loss_fn=loss_fn)
        else:
            self.schedule = cls(stages, self.microbatches, loss_fn=loss_fn)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self._in_backward = False

    def _output_hook(self, module: Any, inputs: Any, output: Any) -> None:
        if output.requires_grad:
            output.register_hook(self._first_backward)

    def _first_backward(self, grad: Any) -> None:
        if not self._in_backward:
            self._in_backward = True
            self.ctx.point("between_fwd_bwd")

    def step(self) -> float:
        ctx = self.ctx
        x, y = ctx.batch(rows=2 * self.microbatches, out=DIM, same=True)
        self._in_backward = False
        ctx.point("before_forward")
        losses: list[Any] = []
        kwargs: dict[str, Any] = {}
        if self.last:
            kwargs.update(target=y, losses=losses)
        if self.first:
            self.schedule.step(x, **kwargs)
        else:
            self.schedule.step(**kwargs)
        ctx.point("before_step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(self.torch.stack([loss.detach() for loss in losses]).mean()) if losses else float("nan")


class PipeGpipe(Pipe):
    schedule_name = "ScheduleGPipe"


class Pipe1f1b(Pipe):
    schedule_name = "Schedule1F1B"


class PipeInterleaved(Pipe):
    schedule_name = "ScheduleInterleaved1F1B"
    stages_per_rank = 2


class PipeZbv(Pipe):
    schedule_name = "ScheduleZBVZeroBubble"
    stages_per_rank = 2
    v_shape = True


# ---------------------------------------------------------------------------------------------- Megatron / DeepSpeed
def _pairs(world: int, tp: int) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron's layout, TP fastest: TP groups of consecutive ranks, DP groups across them."""
    tp_groups = [list(range(start, start + tp)) for start in range(0, world, tp)]
    dp_groups = [list(range(t, world, tp)) for t in range(tp)]
    return tp_groups, dp_groups


class MegatronCoalescing(Framework):
    """TP 2 x DP 2. A column-parallel layer then a row-parallel one (its output all-reduced in
    the TP group); a distributed optimizer: the flat gradient buffer reduce-scattered in the DP
    group in two buckets inside one `_coalescing_manager(async_ops=True)`, the updated shards
    all-gathered back inside another; both waited with `cm.wait()`."""

    def setup(self) -> None:
        torch, dist, nn = self.torch, self.dist, self.torch.nn
        world, rank = self.ctx.world, self.ctx.rank
        tp = 2
        self.tp_size, self.dp_size = tp, world // tp
        tp_groups, dp_groups = _pairs(world, tp)
        for members in tp_groups:
            g = dist.new_group(members, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
            if rank in members:
                self.tp_group = g
        for members in dp_groups:
            g = dist.new_group(members, group_desc="DATA_PARALLEL_GROUP")
            if rank in members:
                self.dp_group = g
        self.tp_rank = rank % tp
        torch.manual_seed(self.ctx.args.seed)
        w1 = torch.randn(32, DIM) * 0.3
        w2 = torch.randn(1, 32) * 0.3
        part = 32 // tp
        self.w1 = nn.Parameter(w1[self.tp_rank * part:(self.tp_rank + 1) * part].clone())  # column-parallel
        self.w2 = nn.Parameter(w2[:, self.tp_rank * part:(self.tp_rank + 1) * part].clone())  # row-parallel
        self.model = nn.ParameterList([self.w1, self.w2])
        self.params = [self.w1, self.w2]
        self.numel = sum(p.numel() for p in self.params)
        pad = (-self.numel) % (2 * self.dp_size)  # two buckets, each divisible by DP
        self.flat = torch.zeros(self.numel + pad)
        self.lr = 0.05

    def _forward(self, x: Any, y: Any) -> Any:
        torch = self.torch
        h = torch.relu(x @ self.w1.t())
        out = h @ self.w2.t()
        out = _TpAllReduce.apply(out, self.tp_group)
        return torch.nn.functional.mse_loss(out, y)

    def step(self) -> float:
        from torch.distributed import _coalescing_manager

        ctx, torch, dist = self.ctx, self.torch, self.dist
        # the data-parallel rank picks the batch; TP peers see the same one
        dp_rank = ctx.rank // self.tp_size
        g = torch.Generator().manual_seed(ctx.args.seed * 100_003 + ctx.step * 101 + dp_rank)
        x, y = torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 1, generator=g)
        ctx.point("before_forward")
        loss = self._forward(x, y)
        ctx.point("between_fwd_bwd")
        loss.backward()
        ctx.point("before_step")
        flat = self.flat
        flat.zero_()
        offset = 0
        for p in self.params:
            assert p.grad is not None
            flat[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            offset += p.numel()
        buckets = flat.chunk(2)
        shards = [torch.empty(b.numel() // self.dp_size) for b in buckets]
        with _coalescing_manager(self.dp_group, async_ops=True) as cm:
            for shard, bucket in zip(shards, buckets, strict=True):
                dist.reduce_scatter_tensor(shard, bucket, group=self.dp_group, async_op=True)
        cm.wait()
        for shard in shards:  # the distributed optimizer's update of this rank's shards
            shard.mul_(-self.lr / self.dp_size)
        updates = [torch.empty_like(b) for b in buckets]
        with _coalescing_manager(self.dp_group, async_ops=True) as cm:
            for update, shard in zip(updates, shards, strict=True):
                dist.all_gather_into_tensor(update, shard, group=self.dp_group, async_op=True)
        cm.wait()
        delta = torch.cat(updates)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.add_(delta[offset:offset + p.numel()].reshape(p.shape))
                p.grad = None
                offset += p.numel()
        return float(loss.detach())


def _tp_all_reduce_class() -> Any:
    import torch
    import torch.distributed

    class TpAllReduce(torch.autograd.Function):
        """Megatron's reduce_from_tensor_model_parallel_region: all_reduce forward, identity backward."""

        @staticmethod
        def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
            out = t.clone()
            torch.distributed.all_reduce(out, group=group)
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return grad, None

    return TpAllReduce


class _LazyTpAllReduce:
    _cls: Any = None

    def apply(self, t: Any, group: Any) -> Any:
        if self._cls is None:
            self._cls = _tp_all_reduce_class()
        return self._cls.apply(t, group)


_TpAllReduce = _LazyTpAllReduce()


class DeepspeedCoalesced(Framework):
    """DeepSpeed style (ZeRO-1-like): the grads all-reduced with `all_reduce_coalesced`, each rank
    updates its partition of the flat weights and of the flat biases, and both partitions are
    all-gathered back with one `all_gather_coalesced`."""

    def setup(self) -> None:
        self.model = _mlp()
        params = list(self.model.parameters())
        self.groups = [[p for p in params if p.dim() > 1], [p for p in params if p.dim() == 1]]
        self.lr = 0.05

    def _flat(self, tensors: list[Any]) -> Any:
        flat = self.torch.cat([t.detach().reshape(-1) for t in tensors])
        return self.torch.nn.functional.pad(flat, (0, (-flat.numel()) % self.ctx.world))

    def step(self) -> float:
        ctx, torch, dist = self.ctx, self.torch, self.dist
        world = ctx.world
        x, y = ctx.batch()
        ctx.point("before_forward")
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        ctx.point("between_fwd_bwd")
        loss.backward()
        ctx.point("before_step")
        dist.all_reduce_coalesced([p.grad for p in self.model.parameters()])
        updates = []
        for params in self.groups:  # this rank's partition of each flat buffer, updated
            flat, grads = self._flat(params), self._flat([p.grad for p in params])
            part = flat.numel() // world
            mine = slice(ctx.rank * part, (ctx.rank + 1) * part)
            updates.append(flat[mine] - self.lr / world * grads[mine])
        outputs = [[torch.empty_like(u) for u in updates] for _ in range(world)]
        dist.all_gather_coalesced(outputs, updates)
        with torch.no_grad():
            for k, params in enumerate(self.groups):
                flat = torch.cat([outputs[r][k] for r in range(world)])
                offset = 0
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].reshape(p.shape))
                    p.grad = None
                    offset += p.numel()
        return float(loss.detach())


# ---------------------------------------------------------------------------------------------- DCP
class Dcp(Framework):
    """Plain data parallelism (grads all-reduced by hand) with torch.distributed.checkpoint: save
    every 2 steps, load back every 4 (after the optimizer step, so a hang may sit in DCP)."""

    def setup(self) -> None:
        import tempfile

        self.model = _mlp()
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)
        # the same directory on every rank: rank 0 makes it and broadcasts the name
        name = [tempfile.mkdtemp(prefix="mycroft-dcp-") if self.ctx.rank == 0 else ""]
        self.dist.broadcast_object_list(name, src=0)
        self.dir = str(name[0])

    def step(self) -> float:
        import torch.distributed.checkpoint as dcp

        ctx, torch, dist = self.ctx, self.torch, self.dist
        x, y = ctx.batch()
        ctx.point("before_forward")
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        ctx.point("between_fwd_bwd")
        loss.backward()
        for p in self.model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad.div_(ctx.world)
        ctx.point("before_step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        path = os.path.join(self.dir, f"step{ctx.step}")
        if ctx.step % 2 == 0:
            dcp.save({"model": self.model.state_dict()}, checkpoint_id=path)
        if ctx.step % 4 == 0:
            state = {"model": self.model.state_dict()}
            dcp.load(state, checkpoint_id=path)
            self.model.load_state_dict(state["model"])
        return float(loss.detach())


# ---------------------------------------------------------------------------------------------- DeviceMesh 2-D
class Mesh2d(Framework):
    """(dp_shard 2, tp 2) + the flattened dp_shard_tp dim: a TP all_reduce of the activations
    (dist on the tp dim's group), the grads averaged over dp_shard (funcol on the mesh dim), the
    loss summed over the flattened dim."""

    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        self.flat = self.mesh["dp_shard", "tp"]._flatten()
        self.model = _mlp()
        self.opt = self.torch.optim.SGD(self.model.parameters(), lr=0.05)

    def step(self) -> float:
        import torch.distributed._functional_collectives as funcol

        ctx, torch, dist = self.ctx, self.torch, self.dist
        dp_rank = self.mesh.get_local_rank("dp_shard")
        g = torch.Generator().manual_seed(ctx.args.seed * 100_003 + ctx.step * 101 + dp_rank)
        x, y = torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 1, generator=g)
        ctx.point("before_forward")
        h = self.model(x)
        with torch.no_grad():
            stat = h.detach().mean().reshape(1).clone()
            dist.all_reduce(stat, group=self.mesh.get_group("tp"))  # tp dim
        loss = torch.nn.functional.mse_loss(h, y) + 0.0 * stat.sum()
        ctx.point("between_fwd_bwd")
        loss.backward()
        for p in self.model.parameters():
            assert p.grad is not None
            p.grad.copy_(funcol.all_reduce(p.grad, "sum", (self.mesh, 0)) / 2)  # dp_shard dim
        ctx.point("before_step")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total, group=self.flat.get_group())  # flattened dim (the world)
        return float(loss.detach())


class Startup(Ddp):
    """ddp; the fault is a rank that blocks before init_process_group (see run_worker)."""


FRAMEWORKS: dict[str, type[Framework]] = {
    "ddp": Ddp, "ddp_unused": DdpUnused,
    "fsdp1": Fsdp1, "fsdp2": Fsdp2, "fsdp2_hsdp": Fsdp2Hsdp, "fsdp2_prefetch": Fsdp2Prefetch,
    "tp_eager": TpEager, "tp_compiled": TpCompiled, "compile_fullgraph": CompileFullgraph,
    "pipe_gpipe": PipeGpipe, "pipe_1f1b": Pipe1f1b, "pipe_interleaved": PipeInterleaved, "pipe_zbv": PipeZbv,
    "megatron_coalescing": MegatronCoalescing, "deepspeed_coalesced": DeepspeedCoalesced,
    "dcp": Dcp, "mesh2d": Mesh2d, "startup": Startup,
}
# worlds a framework needs (exactly 4: 2x2 meshes and TP 2 x DP 2)
NEEDS_FOUR = ("fsdp2_hsdp", "mesh2d", "megatron_coalescing")
# the telemetry threads of a rank: Mycroft's own, and gRPC's (in these jobs only Mycroft's exporter uses gRPC)
TELEMETRY_THREADS = ("mycroft", "event_engine", "grpc")


def telemetry_cpu_ns() -> dict[str, int]:
    """CPU so far of each of this process's telemetry threads, by tid (schedstat: ns-exact, per thread,
    where the process's CPU per step cannot tell whose time it is)."""
    out: dict[str, int] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                if not handle.read().startswith(TELEMETRY_THREADS):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                out[tid] = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return out


class _AB:
    """--ab-block B: every B steps every rank switches the instrumentation off or on (between two
    barriers), so traced and plain blocks of steps share the machine's noise; the first 2 steps
    after a switch are not counted. Step times go to <ab-out>/steps-<rank>-{traced,plain}.txt, the
    process's CPU time per step to cpu-<rank>-{traced,plain}.txt, and per traced block the CPU of the
    telemetry threads, the process's CPU and the wall time (seconds) to telemetry-<rank>.txt."""

    def __init__(self, args: argparse.Namespace, job: Framework) -> None:
        from mycroft.instrumentation.instrumentor import MycroftInstrumentor

        self.block, self.out, self.job = args.ab_block, args.ab_out, job
        self.instrumentor = MycroftInstrumentor()  # the instance opentelemetry-instrument made (a singleton)
        self.times: dict[str, list[float]] = {"traced": [], "plain": []}
        # the process's CPU per step (every thread: training, gloo's, Mycroft's): on a machine with fewer
        # cores than ranks, wall time is mostly the scheduler's; CPU time is what tracing costs
        self.cpu: dict[str, list[float]] = {"traced": [], "plain": []}
        self.telemetry: list[tuple[float, float, float]] = []
        self._block_began: tuple[dict[str, int], float, float] | None = None
        self._begin_traced_block()  # the first block is traced: instrumented since the start

    def _begin_traced_block(self) -> None:
        self._block_began = (telemetry_cpu_ns(), time.process_time(), time.perf_counter())

    def _end_traced_block(self) -> None:
        """Before uninstrument(): its threads' CPU is only readable while they live."""
        if self._block_began is None:
            return
        threads, cpu, wall = self._block_began
        self._block_began = None
        used = sum(ns - threads.get(tid, 0) for tid, ns in telemetry_cpu_ns().items())
        self.telemetry.append((used / 1e9, time.process_time() - cpu, time.perf_counter() - wall))

    def mode(self, step: int) -> str:
        return "traced" if ((step - 1) // self.block) % 2 == 0 else "plain"

    def switch(self, step: int) -> None:
        if (step - 1) % self.block:
            return
        dist = self.job.dist
        dist.barrier()
        on = self.instrumentor.is_instrumented_by_opentelemetry
        if self.mode(step) == "traced" and not on:
            self.instrumentor.instrument()
        elif self.mode(step) == "plain" and on:
            self._end_traced_block()
            self.instrumentor.uninstrument()
        else:
            dist.barrier()
            return
        self.job.rewrap()
        dist.barrier()
        if self.mode(step) == "traced":
            self._begin_traced_block()

    def record(self, step: int, seconds: float, cpu_seconds: float) -> None:
        if (step - 1) % self.block >= 2:
            self.times[self.mode(step)].append(seconds)
            self.cpu[self.mode(step)].append(cpu_seconds)

    def write(self, rank: int) -> None:
        self._end_traced_block()
        Path(self.out, f"telemetry-{rank}.txt").write_text(
            "\n".join(f"{used:.6f} {cpu:.6f} {wall:.6f}" for used, cpu, wall in self.telemetry))
        for prefix, table in (("steps", self.times), ("cpu", self.cpu)):
            for mode, values in table.items():
                Path(self.out, f"{prefix}-{rank}-{mode}.txt").write_text("\n".join(f"{t:.7f}" for t in values))


def _write(path: str, doc: dict[str, Any]) -> None:
    if not path:
        return
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _identity() -> tuple[int, int, int]:
    """(rank, world, local rank): torchrun / torch.distributed.run / spawn set RANK, SLURM sets PROCID."""
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0"))


def run_worker(args: argparse.Namespace) -> int:
    rank, world, _ = _identity()
    if args.in_code:
        try:
            from mycroft.instrumentation import start
        except ImportError:
            print("framework_jobs: mycroft.instrumentation.start() is not there yet (--in-code pending)",
                  file=sys.stderr)
            return 3
        start()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx = Ctx(args, rank, world)
    if args.framework == "startup" and ctx.faulty:
        ctx.block("before_init_process_group")  # the others wait for it in rendezvous
    torch.manual_seed(args.seed)
    if args.verbose:
        print(f"framework_jobs: rank {rank} init_process_group at {time.time():.3f}", file=sys.stderr, flush=True)
    dist.init_process_group("gloo")
    if args.framework in NEEDS_FOUR and world != 4:
        raise SystemExit(f"framework_jobs: {args.framework} needs 4 ranks, got {world}")
    job = FRAMEWORKS[args.framework](ctx)
    torch.manual_seed(args.seed)
    job.setup()
    loss = float("nan")
    ab = _AB(args, job) if args.ab_block else None
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        ctx.begin_step(step)
        if args.verbose:
            print(f"framework_jobs: rank {rank} step {step} at {time.time():.3f}", file=sys.stderr, flush=True)
        if ab is not None:
            ab.switch(step)
        began, cpu_began = time.perf_counter(), time.process_time()
        loss = job.step()
        if ab is not None:
            ab.record(step, time.perf_counter() - began, time.process_time() - cpu_began)
    took = time.perf_counter() - started
    if ab is not None:
        ab.write(rank)
    if rank == job.loss_rank:
        _write(args.loss_file, {"loss": loss, "rank": rank, "steps": args.steps, "params_sum": job.params_sum(),
                                "step_s": took / max(1, args.steps)})
    if rank == 0 and args.graph_breaks_file:
        from torch._dynamo.utils import counters

        _write(args.graph_breaks_file, {"graph_breaks": sum(counters["graph_break"].values()),
                                        "reasons": sorted(counters["graph_break"])[:20]})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _spawned(index: int, argv: list[str], world: int) -> None:
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(world))
    code = run_worker(parse(argv))
    if code:
        raise SystemExit(code)


def spawn(argv: list[str], nprocs: int) -> int:
    """`--spawn N`: torch.multiprocessing.spawn with env:// rendezvous on a free port."""
    import socket

    import torch.multiprocessing as mp

    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    mp.spawn(_spawned, args=(argv, nprocs), nprocs=nprocs, join=True)
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mycroft.faults.framework_jobs",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--framework", required=True, choices=sorted(FRAMEWORKS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--fault-rank", type=int, default=0)
    parser.add_argument("--fault-step", type=int, default=3,
                        help="the block strikes in the N-th step that begins after the warm-up (1 = the first)")
    parser.add_argument("--warmup-s", type=float, default=0.0,
                        help="seconds after the first step ended before fault steps count (default 0: from step 1)")
    parser.add_argument("--fault-point", choices=(*POINTS, "any"), default="any")
    parser.add_argument("--onset-file", default="")
    parser.add_argument("--loss-file", default="")
    parser.add_argument("--graph-breaks-file", default="")
    parser.add_argument("--compile-backend", default="aot_eager")
    parser.add_argument("--spawn", type=int, default=0, metavar="N", help="start N workers with mp.spawn (env://)")
    parser.add_argument("--in-code", action="store_true", help="call mycroft.instrumentation.start() first")
    parser.add_argument("--verbose", action="store_true", help="every rank prints when each step starts")
    parser.add_argument("--ab-block", type=int, default=0, metavar="B",
                        help="under opentelemetry-instrument: switch the instrumentation off / on every B steps")
    parser.add_argument("--ab-out", default=".", help="--ab-block: where the step times go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.spawn:
        rest = []
        skip = False
        for i, a in enumerate(argv):  # the workers get the same options, less --spawn
            if skip:
                skip = False
                continue
            if a == "--spawn":
                skip = True
                continue
            if a.startswith("--spawn="):
                continue
            rest.append(argv[i])
        return spawn(rest, args.spawn)
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
