"""A gloo DDP job written as srun users write it: the script sets RANK / WORLD_SIZE / LOCAL_RANK from
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID itself, then trains (a data-loading function, forward,
backward with DDP's bucketed all-reduce, an optimizer step).

    srun -n 4 opentelemetry-instrument python srun_ddp.py

Environment: SRUN_BLOCK_RANK / SRUN_BLOCK_STEP (that rank blocks forever at that step, after
writing SRUN_ONSET_FILE: in user code, or with SRUN_BLOCK_IN=data in its data loading), SRUN_STEPS,
SRUN_PID_DIR (each rank writes its pid to <dir>/rank-<r>.pid once its first step is done),
SRUN_COMPUTE / SRUN_BATCH (layer width, batch: how long a step computes).
"""

from __future__ import annotations

import json
import os
import time


def _block() -> None:
    onset = os.environ.get("SRUN_ONSET_FILE")
    if onset:
        with open(onset + ".tmp", "w") as handle:
            json.dump({"onset": time.time()}, handle)
        os.replace(onset + ".tmp", onset)
    while True:  # a stuck read (a dead NFS mount, a worker that never answers)
        time.sleep(0.5)


def sync_with_parameter_server() -> None:
    """User code that is no known pause: the blocked rank (SRUN_BLOCK_IN=user) never returns from here."""
    _block()


def blocks_at(step: int, rank: int) -> bool:
    return rank == int(os.environ.get("SRUN_BLOCK_RANK", "-1")) and step == int(os.environ.get("SRUN_BLOCK_STEP", "-1"))


def load_batch(step: int, rank: int, size: int) -> tuple[object, object]:
    """The data loader (a known pause: data loading): the blocked rank (SRUN_BLOCK_IN=data) never
    returns from here at its step."""
    import torch

    if blocks_at(step, rank) and os.environ.get("SRUN_BLOCK_IN", "user") == "data":
        _block()
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    batch = int(os.environ.get("SRUN_BATCH", "64"))
    return torch.randn(batch, size, generator=generator), torch.randn(batch, 1, generator=generator)


def main() -> None:
    # as srun users do: the script sets torch's variables from SLURM's
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    size = int(os.environ.get("SRUN_COMPUTE", "256"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(size, size), torch.nn.ReLU(), torch.nn.Linear(size, size), torch.nn.ReLU(),
        torch.nn.Linear(size, 1)), bucket_cap_mb=0.05)  # several buckets: all-reduces during backward
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    pid_dir = os.environ.get("SRUN_PID_DIR")
    for step in range(int(os.environ.get("SRUN_STEPS", "100000"))):
        if blocks_at(step, rank) and os.environ.get("SRUN_BLOCK_IN", "user") == "user":
            sync_with_parameter_server()
        x, y = load_batch(step, rank, size)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0 and pid_dir:
            with open(os.path.join(pid_dir, f"rank-{rank}.pid"), "w") as handle:
                handle.write(str(os.getpid()))
        time.sleep(0.02)
    print(f"rank {rank} done loss={float(loss):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
