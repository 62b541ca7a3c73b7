"""A short job for two torchrun "nodes" (tests/instrumentation/test_multinode.py): a few all_reduces of
rank + 1 over the world; every rank prints the last sum (1 + 2 + ... + world)."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.zeros(4)
    for _ in range(20):
        value = torch.full((4,), float(dist.get_rank() + 1))
        dist.all_reduce(value)
    dist.barrier()
    print(f"final_sum={value[0].item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
