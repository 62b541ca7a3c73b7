"""megatron-core on CPU/gloo: a tiny tensor-parallel LM, megatron DDP, optional pipeline stages.

    torchrun --nproc-per-node 4 examples/frameworks/megatron_core_tp_dp.py --tp 2           # TP2 x DP2
    torchrun --nproc-per-node 4 examples/frameworks/megatron_core_tp_dp.py --tp 2 --dist-opt
    torchrun --nproc-per-node 4 examples/frameworks/megatron_core_tp_dp.py --tp 1 --pp 2    # PP2 x DP2

Model: VocabParallelEmbedding -> MLP blocks (ColumnParallelLinear -> gelu ->
RowParallelLinear, residual) -> ColumnParallelLinear head -> vocab_parallel_cross_entropy,
split over ``--pp`` stages. Collectives, and from where (read in megatron-core 0.16.1):

* ``parallel_state.initialize_model_parallel``: ``torch.distributed.new_group`` for every
  TP / PP / DP / CP / EP / embedding group, each twice (a gloo copy: ``create_gloo_process_groups``).
* TP (``tensor_parallel/mappings.py``): ``torch.distributed.all_reduce`` on the TP group:
  forward of RowParallelLinear and VocabParallelEmbedding, backward of ColumnParallelLinear
  (``layers.py``, async ``all_reduce`` overlapped with the weight-grad GEMM), and three in
  ``vocab_parallel_cross_entropy`` (MAX of logits, SUM of target logits, SUM of exp).
* DP (``distributed/param_and_grad_buffer.py``, ``overlap_grad_reduce=True``): as each
  bucket of the contiguous grad buffer fills during backward, its bucket group issues
  ``all_reduce`` (or, with ``--dist-opt``, ``reduce_scatter_tensor``) with ``async_op=True``
  inside ``torch.distributed._coalescing_manager``; on torch 2.13 those calls only record
  the op and the manager's exit issues one ``ProcessGroup.allreduce_coalesced`` /
  ``reduce_scatter_single_coalesced`` from the C++ binding. ``finalize_model_grads`` waits.
  ``--dist-opt`` then steps Adam on this rank's shard of the param buffer (what megatron's
  DistributedOptimizer does) and calls ``start_param_sync`` (``all_gather_into_tensor``
  in a ``_coalescing_manager``).
  ``DDP.broadcast_params``: one ``broadcast`` per parameter over DP at start.
* PP (``pipeline_parallel/p2p_communication.P2PCommunicator``): ``batch_isend_irecv`` of
  activations forward and their grads backward (``batch_p2p_comm=True``).
* this script: one ``all_reduce`` of the logged loss over DP per step (as Megatron's
  ``average_losses_across_data_parallel_group``).

Needs CUDA (not run here): megatron's DistributedOptimizer and FP32/Float16 optimizers
(``param.type() == 'torch.cuda.FloatTensor'`` checks, ``device='cuda'`` tensors), the
schedules in ``pipeline_parallel/schedules.py`` (``torch.zeros(..., device="cuda")``),
``model_parallel_cuda_manual_seed``. Grad/param buffers, TP gather/reduce-scatter buffers
and p2p receive buffers are allocated on ``torch.cuda.current_device()``: this script points
that one function at the CPU (``_cpu_current_device`` below), nothing else is changed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from _common import maybe_block, parse_args, report, seed_everything


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


torch.cuda.current_device = _cpu_current_device  # megatron allocates buffers there

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core import tensor_parallel as tp  # noqa: E402
from megatron.core.distributed import (  # noqa: E402
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

VOCAB, HIDDEN, FFN, SEQ, MICRO = 64, 32, 64, 8, 4


class Stage(MegatronModule):
    """The layers of one pipeline stage: [embedding] + blocks + [head]."""

    def __init__(self, config: TransformerConfig, n_blocks: int, first: bool, last: bool):
        super().__init__(config)
        # read by finalize_model_grads (untied embedding/head: no embedding-group all-reduce)
        self.pre_process, self.post_process, self.share_embeddings_and_output_weights = first, last, False
        init = torch.nn.init.xavier_normal_
        self.embed = tp.VocabParallelEmbedding(VOCAB, HIDDEN, init_method=init, config=config) if first else None
        self.blocks = torch.nn.ModuleList()
        for _ in range(n_blocks):
            fc1 = tp.ColumnParallelLinear(HIDDEN, FFN, config=config, init_method=init, bias=True, gather_output=False)
            fc2 = tp.RowParallelLinear(
                FFN, HIDDEN, config=config, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
            )
            self.blocks.append(torch.nn.ModuleList([fc1, fc2]))
        self.head = (
            tp.ColumnParallelLinear(HIDDEN, VOCAB, config=config, init_method=init, bias=False, gather_output=False)
            if last
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # tokens [s, b] or hidden [s, b, h]
        h = self.embed(x) if self.embed is not None else x
        for fc1, fc2 in self.blocks:
            y, _ = fc1(h)
            y, _ = fc2(torch.nn.functional.gelu(y))
            h = h + y
        if self.head is not None:
            h, _ = self.head(h)  # vocab-parallel logits [s, b, V/tp]
        return h


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (SEQ, MICRO), generator=gen)
    return tokens, (tokens * 3 + 1) % VOCAB  # a learnable mapping


def main() -> None:
    def extra(p):
        p.add_argument("--tp", type=int, default=2)
        p.add_argument("--pp", type=int, default=1)
        p.add_argument("--dist-opt", action="store_true", help="shard grads/params over DP (reduce-scatter)")
        p.add_argument("--lr", type=float, default=0.01)

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    rank = dist.get_rank()
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    pp_size, dp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_data_parallel_rank()

    config = TransformerConfig(
        num_layers=2 * pp_size, hidden_size=HIDDEN, num_attention_heads=2, tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp, use_cpu_initialization=True, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, batch_p2p_comm=True, batch_p2p_sync=False,  # sync = cuda.synchronize
    )
    seed_everything(args.seed + 100 * ps.get_pipeline_model_parallel_rank())  # same init across TP and DP
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=True, use_distributed_optimizer=args.dist_opt, bucket_size=1024
    )
    model = DistributedDataParallel(config, ddp_config, Stage(config, 2, first, last))
    model.broadcast_params()
    params = [p for p in model.parameters() if p.requires_grad]
    if args.dist_opt:  # ZeRO-1 Adam, as megatron's DistributedOptimizer: this DP rank's shard of each bucket
        shards = []
        for group in model.bucket_groups:
            size, idx = group.intra_distributed_optimizer_instance_size, group.intra_distributed_optimizer_instance_rank
            for b in group.buckets:
                n = b.param_data.numel() // size
                shard = b.param_data[idx * n : (idx + 1) * n]
                shard.grad = b.grad_data[idx * n : (idx + 1) * n]  # reduce-scattered there
                shards.append(shard)
        opt = torch.optim.Adam(shards, lr=args.lr)
    else:
        opt = torch.optim.Adam(params, lr=args.lr)
    p2p = P2PCommunicator(ps.get_pipeline_model_parallel_group(), config)
    shape = (SEQ, MICRO, HIDDEN)
    gen = torch.Generator().manual_seed(args.seed * 1000 + dp_rank)  # same batch on a DP rank's TP/PP ranks

    loss_val = float("nan")
    for step in range(args.steps):
        tokens, labels = batch(gen)
        model.zero_grad_buffer()
        maybe_block(args, rank, step, "before_forward")
        inp = tokens if first else p2p.recv_forward(shape, is_first_stage=False).requires_grad_()
        out = model(inp)
        p2p.send_forward(out, is_last_stage=last)
        maybe_block(args, rank, step, "between_fwd_bwd")
        if last:
            loss = tp.vocab_parallel_cross_entropy(out, labels).mean()
            loss.backward()
        else:
            out.backward(p2p.recv_backward(shape, is_last_stage=False))
        if not first:
            p2p.send_backward(inp.grad, is_first_stage=False)
        finalize_model_grads([model])  # waits for the bucket reductions
        maybe_block(args, rank, step, "before_step")
        if args.dist_opt:
            opt.step()
            model.start_param_sync(force_sync=True)  # all-gather the updated shards
        else:  # megatron's own optimizers need CUDA: step on main_grad by hand
            for p in params:
                p.grad = p.main_grad
            opt.step()
            opt.zero_grad(set_to_none=True)  # else autograd accumulates into the buffer twice
        if last:
            avg = loss.detach().clone()
            dist.all_reduce(avg, group=ps.get_data_parallel_group())
            loss_val = avg.item() / ps.get_data_parallel_world_size()

    # hand the last stage's loss to rank 0 (first stage) for the result line
    out = torch.tensor([loss_val if last and rank == dist.get_world_size() - 1 else 0.0])
    dist.all_reduce(out)
    report(out.item())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
