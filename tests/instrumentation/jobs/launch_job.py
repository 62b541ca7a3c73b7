"""A small gloo job for the launcher tests: all_reduce steps; one rank may block at a step.

    torchrun ... launch_job.py                 ranks from torchrun's environment
    srun -n 4 python launch_job.py             ranks from SLURM_PROCID / SLURM_NTASKS (no torchrun)
    python launch_job.py --spawn 4             torch.multiprocessing.spawn, env:// init
    python launch_job.py --ray 4               4 Ray actors (a local Ray instance), env:// init
    ... --in-code                              mycroft.instrumentation.start() (no opentelemetry-instrument)
Environment: LAUNCH_BLOCK_RANK, LAUNCH_BLOCK_STEP, LAUNCH_STEPS, LAUNCH_ONSET_FILE.
"""

from __future__ import annotations

import json
import os
import sys
import time


def worker(rank: int, world: int, in_code: bool) -> None:
    import torch
    import torch.distributed as dist

    if in_code:
        import mycroft.instrumentation

        mycroft.instrumentation.start()
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    block_rank = int(os.environ.get("LAUNCH_BLOCK_RANK", "-1"))
    block_step = int(os.environ.get("LAUNCH_BLOCK_STEP", "10"))
    t = torch.ones(16)
    for step in range(int(os.environ.get("LAUNCH_STEPS", "40"))):
        if rank == block_rank and step == block_step:
            onset = os.environ.get("LAUNCH_ONSET_FILE")
            if onset:
                with open(onset, "w") as handle:
                    json.dump({"onset": time.time(), "step": step, "position": "before all_reduce"}, handle)
            while True:
                time.sleep(1)
        dist.all_reduce(t)
        time.sleep(0.05)
    print(f"rank {rank} done sum={float(t.sum())}", flush=True)
    dist.destroy_process_group()


def ray_main(world: int, in_code: bool) -> None:
    """Ray actors as RL trainers use them: each actor process joins one gloo group itself.

    The actors' processes are Ray's workers (started by its raylet, not by this script), so
    `opentelemetry-instrument` reaches them only through the environment they inherit.
    """
    import ray

    @ray.remote(num_cpus=0)
    class Trainer:
        def run(self, rank: int) -> None:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
            worker(rank, world, in_code)

    ray.init(num_cpus=world, include_dashboard=False, _temp_dir=os.environ.get("LAUNCH_RAY_DIR") or None)
    try:
        actors = [Trainer.remote() for _ in range(world)]  # type: ignore[attr-defined]
        ray.get([actor.run.remote(rank) for rank, actor in enumerate(actors)])
    finally:
        ray.shutdown()


def main() -> None:
    in_code = "--in-code" in sys.argv
    if "--ray" in sys.argv:
        ray_main(int(sys.argv[sys.argv.index("--ray") + 1]), in_code)
        return
    if "--spawn" in sys.argv:
        import torch.multiprocessing as mp

        world = int(sys.argv[sys.argv.index("--spawn") + 1])
        mp.spawn(worker, args=(world, in_code), nprocs=world)
        return
    if "SLURM_PROCID" in os.environ and "RANK" not in os.environ:  # srun without torchrun
        os.environ["RANK"], os.environ["WORLD_SIZE"] = os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"]
    worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), in_code)


if __name__ == "__main__":
    main()
