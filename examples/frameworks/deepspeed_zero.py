"""DeepSpeed ZeRO on CPU (``DS_ACCELERATOR=cpu``, gloo): a tiny MLP regression.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 4 examples/frameworks/deepspeed_zero.py --stage 2

The CPU accelerator picks gloo when oneccl_bindings_for_pytorch is absent. Every
collective goes ``deepspeed.comm`` (``comm/comm.py``, timed by its ``timed_op``) ->
``TorchBackend`` (``comm/torch.py``) -> the ``torch.distributed`` Python API, so they are
all Python-API calls (read in deepspeed 0.19.8):

* ``deepspeed.initialize``: ``broadcast`` of every parameter from rank 0
  (``engine._broadcast_model``).
* ZeRO 1 and 2 (``runtime/zero/stage_1_and_2.py``, ``overlap_comm`` off): gradients go
  into ``reduce_bucket_size`` buckets (ZeRO 2 from per-parameter backward hooks, ZeRO 1 at
  the end of backward: ``engine.allreduce_gradients`` -> ``reduce_gradients``); a full
  bucket goes through ``average_tensor`` -> ``allreduce_and_scatter`` -> ``allreduce_bucket``
  -> ``dist.all_reduce`` (``use_multi_rank_bucket_allreduce`` is True by default; False
  gives ``dist.reduce`` to each slice's owner). Then ``all_reduce`` of the gradient norm
  (``gradient_clipping``), and after the step ``dist.all_gather_into_tensor`` of the
  updated partitions (``runtime/utils.all_gather_into_tensor_dp_groups``). Seen here per
  step, stage 1 and 2 alike: 3 all_reduce + 1 all_gather_into_tensor.
* ZeRO 3 (``--stage 3``): parameters fetched per module by one flat
  ``all_gather_into_tensor`` (``partition_parameters._all_gather_coalesced`` ->
  ``allgather_fn``, async), gradients by ``coalesced_collectives.reduce_scatter_coalesced``
  (one ``reduce_scatter_tensor`` of an interleaved flat buffer). The
  ``_coalescing_manager`` path (``comm/torch.py:all_gather_coalesced``) is not reached here.
* this script: ``deepspeed.comm.all_reduce_coalesced([loss, n])`` for the logged loss ->
  ``torch.distributed.all_reduce_coalesced`` (deprecated in torch, still on gloo).

The CPU accelerator JIT-builds ``deepspeed_shm_comm`` (g++ + ninja, ~75 s, once, cached in
``~/.cache/torch_extensions``) at ``init_distributed``; it serves only inference_all_reduce.
Built-in Adam with ``torch_adam: true`` (DeepSpeedCPUAdam / FusedAdam would need op builds).
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import deepspeed.comm as dist
import torch
from _common import maybe_block, parse_args, report, seed_everything


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        extra=lambda p: p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2),
    )
    seed_everything(args.seed)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    config = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-2, "torch_adam": True}},
        "zero_optimization": {
            "stage": args.stage,
            "reduce_bucket_size": 2048,  # small buckets: several collectives per backward
            "allgather_bucket_size": 2048,
            "overlap_comm": False,
            "contiguous_gradients": True,
        },
        "steps_per_print": 10**9,
    }
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    g = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(32, 1, generator=g)
    g.manual_seed(args.seed * 1000 + rank + 1)  # each rank its own data shard
    loss_val = float("nan")
    for step in range(args.steps):
        x = torch.randn(16, 32, generator=g)
        y = x @ w_true + 0.1 * torch.randn(16, 1, generator=g)
        maybe_block(args, rank, step, "before_forward")
        loss = torch.nn.functional.mse_loss(engine(x), y)
        maybe_block(args, rank, step, "between_fwd_bwd")
        engine.backward(loss)
        maybe_block(args, rank, step, "before_step")
        engine.step()
        stats = [loss.detach().clone(), torch.ones(())]
        dist.all_reduce_coalesced(stats)
        loss_val = (stats[0] / stats[1]).item()
    dist.barrier()
    report(loss_val)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
