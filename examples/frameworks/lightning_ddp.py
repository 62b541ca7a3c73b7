"""PyTorch Lightning, DDP on CPU (gloo): a tiny MLP regression trained by ``Trainer.fit``.

    torchrun --nproc-per-node 4 examples/frameworks/lightning_ddp.py --steps 20

Under torchrun, Lightning reads the torchelastic environment (``TorchElasticEnvironment``) and
runs ``strategy="ddp"`` with one process per rank; ``init_process_group`` and the
``DistributedDataParallel`` wrap happen inside ``Trainer.fit``. Collectives issued, and from
where (read in lightning 2.6.6 / torch 2.13.0 sources):

* DDP construction (C++ parameter-shape allgather, C++ ``_broadcast_coalesced``) and
  Lightning's set-up ``strategy.barrier`` ("run-stage", "train_dataloader()") and
  ``strategy.broadcast`` (``broadcast_object_list``), Python API.
* every batch: a ``broadcast`` of the SIGTERM flag from rank 0
  (``training_epoch_loop._broadcast_sigterm_tensor``), Python API.
* every backward: the DDP reducer's bucketed gradient ``allreduce`` (C++ reducer).
* ``self.log(..., sync_dist=True)``: an ``all_reduce`` of the logged loss per step, Python API.

The block points are the step's hooks: ``training_step`` (before_forward), ``on_before_backward``
(between_fwd_bwd) and ``on_before_optimizer_step`` (before_step).
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
from _common import maybe_block, parse_args, regression_data, regression_mlp, report, seed_everything
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = regression_mlp()
        self.last_loss = float("nan")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        maybe_block(self.args, self.global_rank, self.global_step, "before_forward")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        maybe_block(self.args, self.global_rank, self.global_step, "between_fwd_bwd")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        maybe_block(self.args, self.global_rank, self.global_step, "before_step")

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        loss = self.trainer.callback_metrics.get("loss")
        if loss is not None:
            self.last_loss = float(loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    seed_everything(args.seed)
    x, y, g = regression_data(args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=g)
    model = Regression(args)
    # on CPU "auto" means one device: the process count comes from torchrun's environment
    devices, nodes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=devices, num_nodes=nodes, max_steps=args.steps,
                        max_epochs=-1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)
    report(model.last_loss)


if __name__ == "__main__":
    main()
