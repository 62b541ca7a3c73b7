"""torchtitan on CPU/gloo: its Llama3 debug model, parallelize_llama (DTensor TP + FSDP2).

    torchrun --nproc-per-node 4 examples/frameworks/torchtitan_llama3_tp_fsdp.py --tp 2   # TP2 x FSDP2
    torchrun --nproc-per-node 4 examples/frameworks/torchtitan_llama3_tp_fsdp.py --tp 1   # FSDP4

torchtitan's Trainer needs CUDA (device memory monitor, datasets, tokenizer assets), so this
is a minimal training loop around torchtitan's own pieces, as ``Trainer.__init__`` and
``train_step`` use them: ``ParallelDims.build_mesh``, the ``llama3`` ``debugmodel`` spec
(2 of its 6 layers, SDPA attention instead of the compiled FlexAttention), the spec's
``parallelize_fn`` (``parallelize_llama``), meta-device build + ``init_weights``,
``loss_parallel`` cross-entropy, ``dist_utils.clip_grad_norm_``. Three changes for CPU:
``torchtitan.tools.utils.device_type`` is set to "cpu" (torchtitan falls back to "cuda"
when no accelerator is found), ``spmd_backend="partial_dtensor"`` (the default
``spmd_types`` failed here: fully_shard "all parameters must be DTensors on the full SPMD
mesh"), and FSDP2 is told to SUM and divide after (gloo has no AVG / PREMUL_SUM).

Collectives, and from where (read in torchtitan 0.3.0 / torch 2.13.0):

* ``ParallelDims.build_mesh`` -> ``init_device_mesh("cpu", ...)`` + unflatten: one
  ``new_group`` per mesh dimension (world, fsdp, tp, batch, ...).
* FSDP2 (``apply_fsdp_to_decoder`` -> ``fully_shard`` per block, embeddings, norm+head):
  ``all_gather_single`` of each unit's parameters before its forward and again before its
  backward (``reshard_after_forward``), ``reduce_scatter_single`` of its gradients in
  post-backward (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): Python API.
* TP (``Module.parallelize`` -> DTensor ``distribute_tensor`` / ``redistribute``):
  functional collectives (``torch.distributed._functional_collectives`` all_reduce /
  all_gather_tensor, ``_c10d_functional`` ops waited by ``wait_tensor``) for the row-parallel
  outputs (wo, w2), ``loss_parallel`` (max and sum-exp over vocab shards) and
  ``clip_grad_norm_`` (``total_norm.full_tensor()``).
* this script: ``all_reduce`` of the logged loss over the batch mesh.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torchtitan.tools.utils as tt_utils
from _common import maybe_block, parse_args, report, seed_everything

tt_utils.device_type = "cpu"  # read by parallel_dims / distributed.utils at import

from torch.distributed.fsdp import FSDPModule  # noqa: E402
from torch.distributed.tensor.parallel import loss_parallel  # noqa: E402
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed import utils as dist_utils  # noqa: E402
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402
from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: E402

SEQ, BATCH, LAYERS = 32, 2, 2


def main() -> None:
    def extra(p):
        p.add_argument("--tp", type=int, default=2)
        p.add_argument("--lr", type=float, default=3e-3)

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    seed_everything(args.seed)  # same init everywhere: init_weights runs on DTensor shards
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    parallelism = ParallelismConfig(
        tensor_parallel_degree=args.tp, spmd_backend="partial_dtensor", enable_sequence_parallel=False
    )
    training = TrainingConfig(local_batch_size=BATCH, seq_len=SEQ, mixed_precision_param="float32")
    dims = ParallelDims.from_config(parallelism, dist.get_world_size())
    dims.build_mesh()
    dist_utils.set_spmd_backend(parallelism.spmd_backend)

    spec = model_registry("debugmodel")
    config = spec.model
    config.layers = config.layers[:LAYERS]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
    with torch.device("meta"):
        model = config.build()
    model = spec.parallelize_fn(
        model, parallel_dims=dims, training=training, parallelism=parallelism,
        compile_config=CompileConfig(), ac_config=None, dump_folder="/tmp",
    )
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo: no AVG / PREMUL_SUM
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    batch_mesh = dims.get_mesh("batch") if dims.dp_enabled else None
    gen = torch.Generator().manual_seed(args.seed * 1000 + (batch_mesh.get_local_rank() if batch_mesh else 0))
    vocab = config.vocab_size
    loss_val = float("nan")
    for step in range(args.steps):
        start = torch.randint(0, vocab, (BATCH, 1), generator=gen)
        seq = (start * 7 + 3 * torch.arange(SEQ + 1)) % vocab  # a learnable next-token rule
        maybe_block(args, rank, step, "before_forward")
        logits = model(seq[:, :-1])
        maybe_block(args, rank, step, "between_fwd_bwd")
        with loss_parallel():  # logits are vocab-sharded DTensors under TP
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
            loss.backward()
        maybe_block(args, rank, step, "before_step")
        dist_utils.clip_grad_norm_(list(model.parameters()), max_norm=1.0)
        opt.step()
        opt.zero_grad()
        logged = loss.detach()
        logged = logged.full_tensor() if hasattr(logged, "full_tensor") else logged.clone()
        if batch_mesh is not None:
            dist.all_reduce(logged, group=batch_mesh.get_group())
            logged /= batch_mesh.size()
        loss_val = logged.item()
    report(loss_val)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
