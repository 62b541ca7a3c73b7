"""KeyboardInterrupt, SystemExit and GeneratorExit in and around collectives, as a user meets them.

One case per process (the exception ends it, as it would end a training script); rank 0 is the one
it happens to. Every rank prints `DONE <rank> <time.time()>` after its collective returned (the
peer's is when the collective completed), and rank 0 prints `AFTER` if it went on past the case. An
uncaught exception is printed by an excepthook as `UNCAUGHT <type> <time.time()> <context type>`
before Python's own report (the context is what it was raised while handling: "None" unless
something replaced or chained it).

Cases (--case):
- sigint: Ctrl-C while rank 0 waits inside a sync all_reduce for its peer (SIGINT 0.5 s into it;
  the peer joins 1.5 s in). Python raises KeyboardInterrupt once the call returns.
- sigint_wait: the same inside `Work.wait()` of an async all_reduce.
- subclass_ki: a tensor subclass whose first `__torch_function__` call raises KeyboardInterrupt
  (without Mycroft, torch's own dispatch of all_reduce to `__torch_function__` makes that call).
- subclass_exit: the same with SystemExit(7).
- odd_exit: a SystemExit(7) whose str() fails, raised by the subclass inside torch's call (at its
  dispatch of all_reduce): noting the op's failure must not put another exception in its place.
- coalesced_ki: KeyboardInterrupt raised in the body of a `_coalescing_manager` block.
- generator_close: a generator suspended inside a `_coalescing_manager` block is closed
  (GeneratorExit at its yield): close() returns, as it does without Mycroft.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist


def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    context = type(value.__context__).__name__ if value.__context__ is not None else "None"
    print(f"UNCAUGHT {kind.__name__} {time.time()} {context}", flush=True)
    sys.__excepthook__(kind, value, tb)


class Raising(torch.Tensor):
    """Raises `raises` at its first __torch_function__ call (of `only`, where set), then is a tensor."""

    raises: BaseException | None = None
    only = ""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if Raising.raises is not None and (not Raising.only or getattr(func, "__name__", "") == Raising.only):
            pending, Raising.raises = Raising.raises, None
            raise pending
        return super().__torch_function__(func, types, args, kwargs or {})


class OddExit(SystemExit):
    def __str__(self) -> str:
        raise RuntimeError("no str")


def done(rank: int) -> None:
    print(f"DONE {rank} {time.time()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    args = parser.parse_args()
    sys.excepthook = excepthook
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(256)
    dist.all_reduce(tensor)  # warm: the group is connected
    case = args.case
    if case in ("sigint", "sigint_wait"):
        if rank == 0:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        else:
            time.sleep(1.5)
        if case == "sigint":
            dist.all_reduce(tensor)
        else:
            dist.all_reduce(tensor, async_op=True).wait()
        done(rank)
        if rank != 0:
            dist.destroy_process_group()
            return
    elif case in ("subclass_ki", "subclass_exit"):
        Raising.raises = KeyboardInterrupt() if case == "subclass_ki" else SystemExit(7)
        dist.all_reduce(torch.ones(256).as_subclass(Raising))
        done(rank)
    elif case == "odd_exit":
        Raising.raises, Raising.only = OddExit(7), "all_reduce"
        dist.all_reduce(torch.ones(256).as_subclass(Raising))
        done(rank)
    elif case == "coalesced_ki":
        with dist._coalescing_manager(async_ops=True):
            dist.all_reduce(tensor)
            raise KeyboardInterrupt
    elif case == "generator_close":
        def steps() -> Any:
            with dist._coalescing_manager(async_ops=True) as manager:
                dist.all_reduce(tensor)
                yield manager

        generator = steps()
        next(generator)
        generator.close()  # GeneratorExit at the yield, through both context managers
        del generator
        print("CLOSED", flush=True)
    else:
        raise SystemExit(f"unknown case {case}")
    print("AFTER", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
