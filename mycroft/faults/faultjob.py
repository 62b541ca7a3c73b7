"""A tiny gloo training job that injects one fault; a torchrun target for `mycroft inject`.

    torchrun --nproc-per-node 4 -m mycroft.faults.faultjob

Driven by environment variables (the harness sets them):
  MYCROFT_FAULT        none | block | sigkill | sigstop | straggler | mismatch | mismatch_size |
                       mismatch_dtype | mismatch_silent | deadlock | chain
                       (mismatch_silent: one all_reduce in int32 where the others reduce float32:
                       equal sizes, so it completes, with wrong results and no error)
  MYCROFT_FAULT_RANK   global rank that misbehaves
  MYCROFT_FAULT_STEP   step at which it starts (1-based)
  MYCROFT_FAULT_STEPS  steps to run (a hung job never gets there)
  MYCROFT_FAULT_STEP_S simulated compute per step, seconds (default 0.05)
  MYCROFT_FAULT_SLOW   straggler compute factor (default 2.5)
  MYCROFT_FAULT_ONSET_FILE  where the faulty rank writes {"fault", "rank", "step", "onset"} (unix s)
  MYCROFT_FAULT_ACK_FILE    "external" faults (network): the faulty rank writes the onset file, then
                            waits until the harness has applied the fault and written this file
  MYCROFT_FAULT_NUMEL  elements of the float32 tensor all-reduced each step (default 1024)

Layouts: "dp" all-reduces in the world group each step; "tpdp" (chain, and any job of
>= 4 even ranks asking for it) all-reduces in a TP pair then a DP pair, like a 2x2
tensor/data-parallel grid; "p2p" (deadlock) also exchanges tensors between rank pairs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

FAULTS = ("none", "block", "sigkill", "sigstop", "straggler", "mismatch", "mismatch_size", "mismatch_dtype",
          "mismatch_silent", "deadlock", "chain", "external")


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _write_onset(path: str, fault: str, rank: int, step: int) -> None:
    if not path:
        return
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({"fault": fault, "rank": rank, "step": step, "onset": time.time()}))
    tmp.replace(path)


def main() -> int:
    import torch
    import torch.distributed as dist

    fault = os.environ.get("MYCROFT_FAULT", "none")
    if fault not in FAULTS:
        print(f"faultjob: unknown MYCROFT_FAULT={fault!r}; one of {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    fault_rank = _env_int("MYCROFT_FAULT_RANK", 0)
    fault_step = _env_int("MYCROFT_FAULT_STEP", 10)
    steps = _env_int("MYCROFT_FAULT_STEPS", 40)
    step_s = float(os.environ.get("MYCROFT_FAULT_STEP_S", "0.05"))
    slow = float(os.environ.get("MYCROFT_FAULT_SLOW", "2.5"))
    onset_file = os.environ.get("MYCROFT_FAULT_ONSET_FILE", "")
    layout = os.environ.get("MYCROFT_FAULT_LAYOUT") or (
        "tpdp" if fault == "chain" else "p2p" if fault == "deadlock" else "dp")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if layout == "tpdp" and (world < 4 or world % 2):
        print("faultjob: the tpdp layout needs an even world size >= 4", file=sys.stderr)
        return 2
    tp_group = dp_group = None
    if layout == "tpdp":
        # TP pairs (0,1), (2,3), ...; DP pairs (0,2), (1,3), ... within each block of 4
        for base in range(0, world, 2):
            g = dist.new_group([base, base + 1])
            if rank in (base, base + 1):
                tp_group = g
        for base in range(0, world, 4):
            for k in range(2):
                members = [base + k, base + k + 2] if base + k + 2 < world else [base + k]
                g = dist.new_group(members)
                if rank in members:
                    dp_group = g
    grad = torch.ones(_env_int("MYCROFT_FAULT_NUMEL", 1024))
    partner = rank ^ 1 if rank ^ 1 < world else rank

    for step in range(1, steps + 1):
        here = rank == fault_rank and step == fault_step
        if here and fault in ("block", "chain"):
            _write_onset(onset_file, fault, rank, step)
            time.sleep(float(os.environ.get("MYCROFT_FAULT_HOLD_S", "3600")))
        elif here and fault == "sigkill":
            _write_onset(onset_file, fault, rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
        elif here and fault == "sigstop":
            _write_onset(onset_file, fault, rank, step)
            os.kill(os.getpid(), signal.SIGSTOP)
        elif here and fault == "straggler":
            _write_onset(onset_file, fault, rank, step)
        elif here and fault == "external":
            _write_onset(onset_file, fault, rank, step)
            ack = os.environ.get("MYCROFT_FAULT_ACK_FILE", "")
            deadline = time.time() + 10
            while ack and not os.path.exists(ack) and time.time() < deadline:
                time.sleep(0.005)
        straggling = fault == "straggler" and rank == fault_rank and step >= fault_step
        time.sleep(step_s * (slow if straggling else 1.0))
        grad.mul_(0.5).add_(1.0)  # a sliver of real work on the tensor we reduce

        if layout == "tpdp":
            dist.all_reduce(grad, group=tp_group)
            dist.all_reduce(grad, group=dp_group)
            continue
        if layout == "p2p" and partner != rank:
            buf = torch.zeros(256)
            send_first = rank < partner
            if here and fault == "deadlock":
                _write_onset(onset_file, fault, rank, step)
                send_first = not send_first  # both sides now send (or receive) first: a cycle
            if send_first:
                dist.send(grad[:256].contiguous(), partner)
                dist.recv(buf, partner)
            else:
                dist.recv(buf, partner)
                dist.send(grad[:256].contiguous(), partner)
        if here and fault == "mismatch":
            _write_onset(onset_file, fault, rank, step)
            dist.broadcast(grad, src=0)  # the others all_reduce at this seq
        elif here and fault == "mismatch_size":
            _write_onset(onset_file, fault, rank, step)
            dist.all_reduce(torch.ones(2 * grad.numel()))
        elif here and fault == "mismatch_dtype":
            _write_onset(onset_file, fault, rank, step)
            dist.all_reduce(grad.double())  # the others reduce float32
        elif here and fault == "mismatch_silent":
            _write_onset(onset_file, fault, rank, step)
            dist.all_reduce(grad.to(torch.int32))  # 4 bytes per element, like the others' float32
        else:
            dist.all_reduce(grad)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
