# ruff: noqa: E702  (one op and its report per line keeps the op list readable)
"""Exercises every op family once; prints one line per op it issued ("DID <api> ...").

The test compares the spans that arrive with these lines: no op may go untraced.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def did(label: str, **facts: object) -> None:
    # ranks share one pipe: each report is one write() of one line (atomic below PIPE_BUF), so
    # reports cannot run into each other; values stay in brackets all the same
    line = "DID " + label + " " + " ".join(f"{k}=[{v}]" for k, v in facts.items()) + "\n"
    os.write(1, line.encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(8)

    dist.all_reduce(t); did("all_reduce")
    dist.all_reduce(t, async_op=True).wait(); did("all_reduce", async_op=True)
    dist.all_gather([torch.zeros(8) for _ in range(world)], t); did("all_gather")
    dist.all_gather_into_tensor(torch.zeros(8 * world), t); did("all_gather_into_tensor")
    dist.all_gather_single(torch.zeros(8 * world), t); did("all_gather_single")
    dist.all_gather_single(torch.zeros(8 * world), t, async_op=True).wait(); did("all_gather_single", async_op=True)
    dist.reduce_scatter_tensor(torch.zeros(8), torch.ones(8 * world)); did("reduce_scatter_tensor")
    dist.reduce_scatter_single(torch.zeros(8), torch.ones(8 * world)); did("reduce_scatter_single")
    dist.reduce_scatter(torch.zeros(8), [torch.ones(8) for _ in range(world)]); did("reduce_scatter")
    dist.broadcast(t, src=0); did("broadcast")
    dist.reduce(t, dst=1); did("reduce")
    dist.gather(t, [torch.zeros(8) for _ in range(world)] if rank == 0 else None, dst=0); did("gather")
    dist.scatter(torch.zeros(8), [torch.ones(8) for _ in range(world)] if rank == 0 else None, src=0); did("scatter")
    dist.all_to_all_single(torch.zeros(4 * world), torch.ones(4 * world)); did("all_to_all_single")
    dist.all_to_all([torch.zeros(2) for _ in range(world)], [torch.ones(2) for _ in range(world)]); did("all_to_all")
    dist.barrier(); did("barrier")
    dist.barrier(async_op=True).wait(); did("barrier", async_op=True)
    dist.all_reduce_coalesced([torch.ones(4), torch.ones(8)]); did("all_reduce_coalesced")
    dist.all_reduce_coalesced([torch.ones(4)], async_op=True).wait(); did("all_reduce_coalesced", async_op=True)
    dist.all_gather_coalesced([[torch.zeros(4)] for _ in range(world)], [torch.ones(4)])
    did("all_gather_coalesced")
    with dist.distributed_c10d._coalescing_manager(async_ops=True) as cm:  # Megatron's grad reduce-scatter
        dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world))
    cm.wait(); did("_coalescing_manager")
    dist._broadcast_coalesced(dist.group.WORLD, [torch.ones(3), torch.ones(5)], 1 << 20, 0)
    did("_broadcast_coalesced")

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        dist.send(t, nxt); dist.recv(t, prv)
    else:
        dist.recv(t, prv); dist.send(t, nxt)
    did("send"); did("recv")
    reqs = [dist.isend(t, nxt), dist.irecv(torch.zeros(8), prv)]
    for req in reqs:
        req.wait()
    did("isend"); did("irecv")
    ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, torch.zeros(8), prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    did("batch_isend_irecv")

    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(t, group=pair); did("subgroup_all_reduce")
    mine, _ = dist.new_subgroups(group_size=2)
    dist.all_reduce(t, group=mine); did("new_subgroups_all_reduce")

    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(t, group=mesh.get_group("tp")); did("mesh_tp_all_reduce", group=mesh.get_group("tp").group_name)
    dist.all_reduce(t, group=mesh.get_group("dp")); did("mesh_dp_all_reduce")

    out = funcol.all_reduce(torch.ones(4), "sum", group=dist.group.WORLD)
    out = funcol.wait_tensor(out) if not hasattr(out, "wait") else out.wait()
    did("funcol_all_reduce")

    from torch.distributed.tensor import DTensor, Replicate, Shard
    dt = DTensor.from_local(torch.ones(4, 4), mesh["tp"], [Shard(0)])
    full = dt.redistribute(mesh["tp"], [Replicate()]).to_local()
    assert full.shape[0] == 4 * (world // 2)
    did("dtensor_redistribute")

    ddp_group = dist.new_group(list(range(world)))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16), process_group=ddp_group)
    model(torch.ones(4, 16)).sum().backward()
    did("ddp_backward", group=ddp_group.group_name)

    from torch.distributed.fsdp import fully_shard
    fsdp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    fsdp_model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    for layer in fsdp_model:
        fully_shard(layer, mesh=fsdp_mesh)
    fully_shard(fsdp_model, mesh=fsdp_mesh)
    fsdp_model(torch.ones(4, 16)).sum().backward()
    did("fsdp_step", group=fsdp_mesh.get_group().group_name)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
