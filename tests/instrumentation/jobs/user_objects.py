"""The user's objects with and without Mycroft: save, load, deep-copy, state_dict.

A short gloo job that builds what people save and copy (a DDP model, an FSDP2 model, a DTensor,
the optimizer's state, a process group, a Work), trains two steps, and tries torch.save +
torch.load and copy.deepcopy on each. Each rank writes `objects-<rank>.json` to --out:

- "outcomes": per attempt, "ok" or the exception's type name (what plain torch does is the
  reference: a Work or a process group may not pickle without Mycroft either);
- "digests": per object, its state_dict as {key: sha256 of the tensor's bytes + shape + dtype},
  for the original, the loaded copy and the deep copy (plain and instrumented runs must agree).

Args: --out DIR
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def digest(value: Any) -> Any:
    """A state_dict (nested dicts / lists of tensors and plain values) as comparable text."""
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        data = local.detach().contiguous().cpu().reshape(-1)
        sha = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
        return f"{tuple(value.shape)} {value.dtype} {sha[:24]}"
    if isinstance(value, dict):
        return {str(key): digest(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [digest(item) for item in value]
    return repr(value)


def attempt(outcomes: dict[str, str], name: str, action: Callable[[], Any]) -> Any:
    try:
        result = action()
    except Exception as exc:  # what plain torch raises is the reference, whatever it is
        outcomes[name] = type(exc).__name__
        return None
    outcomes[name] = "ok"
    return result


def save_load(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def try_object(outcomes: dict[str, str], digests: dict[str, Any], name: str, obj: Any,
               state: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    """torch.save + torch.load and copy.deepcopy of obj; digests of state(obj) for each copy."""
    loaded = attempt(outcomes, f"{name}.save_load", lambda: save_load(obj))
    copied = attempt(outcomes, f"{name}.deepcopy", lambda: copy.deepcopy(obj))
    if state is not None:
        digests[name] = digest(state(obj))
        for suffix, other in (("save_load", loaded), ("deepcopy", copied)):
            if other is not None:
                digests[f"{name}.{suffix}"] = digest(state(other))
    return loaded, copied


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    outcomes: dict[str, str] = {}
    digests: dict[str, Any] = {}
    nn = torch.nn
    inputs = [torch.randn(8, 16) for _ in range(3)]

    # DDP (every MYCROFT_DDP_HOOK setting: the test runs this job under each)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for x in inputs[:2]:
        opt.zero_grad()
        ddp(x + rank).sum().backward()
        opt.step()
    outcomes["ddp.attributes"] = " ".join(sorted(k for k in vars(ddp) if "mycroft" in k.lower())) or "ok"
    _, ddp_copy = try_object(outcomes, digests, "ddp", ddp, lambda m: m.state_dict())
    if ddp_copy is not None:  # the copy trains like the original (both ranks, same step)
        def step_copy() -> Any:
            ddp_copy(inputs[2] + rank).sum().backward()
            return {n: p.grad for n, p in ddp_copy.named_parameters()}
        grads = attempt(outcomes, "ddp.deepcopy.step", step_copy)
        if grads is not None:
            digests["ddp.deepcopy.grads"] = digest(grads)
    try_object(outcomes, digests, "ddp.module", ddp.module, lambda m: m.state_dict())
    try_object(outcomes, digests, "optimizer", opt, lambda o: o.state_dict())
    try_object(outcomes, digests, "optimizer.state_dict", opt.state_dict(), lambda s: s)

    # a process group and a Work (whatever plain torch does with them, Mycroft must do the same)
    pg = dist.group.WORLD
    attempt(outcomes, "process_group.pickle", lambda: pickle.dumps(pg))
    attempt(outcomes, "process_group.deepcopy", lambda: copy.deepcopy(pg))
    work = dist.all_reduce(torch.ones(4), async_op=True)
    work.wait()
    outcomes["work.attributes"] = " ".join(sorted(k for k in dir(work) if "mycroft" in k.lower())) or "ok"
    attempt(outcomes, "work.pickle", lambda: pickle.dumps(work))
    attempt(outcomes, "work.deepcopy", lambda: copy.deepcopy(work))

    # FSDP2 and a DTensor on a 1-D mesh
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    torch.manual_seed(99)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in (model, model[0], model[2]):
        module.set_force_sum_reduction_for_comms(True)  # gloo has no ReduceOp.AVG
    fsdp_opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in inputs[:2]:
        fsdp_opt.zero_grad()
        model(x + rank).sum().backward()
        fsdp_opt.step()
    try_object(outcomes, digests, "fsdp2", model, lambda m: m.state_dict())  # plain torch cannot save / copy it
    try_object(outcomes, digests, "fsdp2.state_dict", model.state_dict(), lambda s: s)
    try_object(outcomes, digests, "fsdp2.optimizer.state_dict", fsdp_opt.state_dict(), lambda s: s)
    torch.manual_seed(7)
    dtensor = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    try_object(outcomes, digests, "dtensor", dtensor, lambda t: {"full": t.full_tensor(), "local": t.to_local()})
    dist.barrier()

    with open(os.path.join(args.out, f"objects-{rank}.json"), "w") as handle:
        json.dump({"outcomes": outcomes, "digests": digests}, handle, indent=1, sort_keys=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
