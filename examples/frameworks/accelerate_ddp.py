"""HF Accelerate, multi-CPU data parallel (gloo): a tiny MLP regression.

    torchrun --nproc-per-node 4 examples/frameworks/accelerate_ddp.py --steps 20

On CPU, ``Accelerator()`` under torchrun is ``DistributedType.MULTI_CPU`` with backend gloo;
``prepare`` wraps the model in ``torch.nn.parallel.DistributedDataParallel``. Collectives
issued, and from where (read in accelerate 1.16.0 / torch 2.13.0 sources):

* DDP construction (C++ ``dist._verify_params_across_processes``: an allgather of
  parameter shapes; ``_sync_module_states`` -> C++ ``_broadcast_coalesced``): from C++.
* every backward: the DDP reducer's bucketed gradient ``allreduce`` (C++ reducer; Mycroft
  routes it through a comm hook on gloo).
* every epoch of the prepared DataLoader (``DataLoaderShard.__iter__`` ->
  ``accelerate.utils.random.synchronize_rng_state``): ``torch.distributed.broadcast`` of
  the sampler generator's state, Python API.
* ``accelerator.reduce(loss)`` -> ``accelerate.utils.operations.reduce`` ->
  ``torch.distributed.all_reduce``, Python API (once per step, for the logged loss).
* ``accelerator.wait_for_everyone()`` -> ``torch.distributed.barrier()``, Python API.

``--fsdp2`` passes ``FullyShardedDataParallelPlugin(fsdp_version=2)``: accelerate only
switches to FSDP for accelerator device types (``AcceleratorState`` keeps MULTI_CPU and
ignores the plugin), so on CPU the model stays DDP. See README.md.
"""

from __future__ import annotations

import torch
from _common import maybe_block, parse_args, regression_data, regression_mlp, report, seed_everything
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        extra=lambda p: p.add_argument("--fsdp2", action="store_true", help="try the FSDP2 plugin"),
    )
    seed_everything(args.seed)
    plugin = None
    if args.fsdp2:
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin)

    x, y, g = regression_data(args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=g)
    model = regression_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, loader = acc.prepare(model, opt, loader)
    if acc.is_main_process:
        print(f"distributed_type={acc.distributed_type} model={type(model).__name__}", flush=True)

    step, loss_val = 0, float("nan")
    while step < args.steps:
        for xb, yb in loader:
            if step >= args.steps:
                break
            maybe_block(args, acc.process_index, step, "before_forward")
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            maybe_block(args, acc.process_index, step, "between_fwd_bwd")
            acc.backward(loss)
            maybe_block(args, acc.process_index, step, "before_step")
            opt.step()
            opt.zero_grad()
            loss_val = acc.reduce(loss.detach(), reduction="mean").item()
            step += 1
    acc.wait_for_everyone()
    report(loss_val)
    acc.end_training()


if __name__ == "__main__":
    main()
