"""Hugging Face Transformers ``Trainer``, DDP on CPU (gloo): a tiny regression model.

    torchrun --nproc-per-node 4 examples/frameworks/hf_trainer.py --steps 20

Under torchrun ``TrainingArguments(use_cpu=True, ddp_backend="gloo")`` makes the Trainer (through
Accelerate's ``PartialState``) call ``init_process_group`` and wrap the model in
``DistributedDataParallel``. Collectives issued, and from where (read in transformers 5.25 /
accelerate 1.16 / torch 2.13 sources):

* DDP construction (C++ parameter-shape allgather, C++ ``_broadcast_coalesced``).
* every backward, from the C++ reducer: the bucketed gradient ``allreduce`` and, because the
  Trainer passes ``find_unused_parameters=True`` for a model that is not a ``PreTrainedModel``,
  the unused-parameter bitmap ``allreduce`` (waited only in the next backward).

In a 20-step run these were all (Mycroft's spans and Flight Recorder frontier): no Python-level
collective per step in this configuration (no logging, evaluation or saving).

The block points: the step's start (``on_step_begin``, before_forward), ``compute_loss`` after the
forward (between_fwd_bwd) and ``on_pre_optimizer_step`` (before_step).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from _common import maybe_block, parse_args, rank, regression_data, regression_mlp, report, seed_everything
from transformers import Trainer, TrainerCallback, TrainingArguments


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = regression_mlp()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.net(x)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else out.sum() * 0
        return {"loss": loss, "logits": out}


class Blocks(TrainerCallback):
    """The hang at the step's start and before the optimizer step (TrainerCallback hooks)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        maybe_block(self.args, rank(), state.global_step, "before_forward")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        maybe_block(self.args, rank(), state.global_step, "before_step")


class BlockingTrainer(Trainer):
    """compute_loss runs the forward: the hang between forward and backward goes after it."""

    def __init__(self, block_args: argparse.Namespace, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.block_args = block_args
        self.last_loss = float("nan")

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):  # type: ignore[no-untyped-def]
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        loss = result[0] if return_outputs else result
        self.last_loss = float(loss.detach())
        maybe_block(self.block_args, rank(), self.state.global_step, "between_fwd_bwd")
        return result


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    seed_everything(args.seed)
    x, y, _ = regression_data(args.seed)
    data = [{"x": x[i], "labels": y[i]} for i in range(len(x))]
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, use_cpu=True, ddp_backend="gloo", max_steps=args.steps,
                                     per_device_train_batch_size=16, learning_rate=0.05, optim="sgd",
                                     lr_scheduler_type="constant", report_to=[], save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                                     seed=args.seed, data_seed=args.seed, max_grad_norm=0.0)
        trainer = BlockingTrainer(args, model=Regression(), args=training, train_dataset=data,
                                  callbacks=[Blocks(args)])
        trainer.train()
    report(trainer.last_loss)


if __name__ == "__main__":
    main()
