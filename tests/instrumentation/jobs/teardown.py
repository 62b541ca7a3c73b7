"""A short gloo job that times its own teardown.

Each rank runs --steps all_reduces, then times `dist.destroy_process_group()` and prints one line
`TEARDOWN {"rank": r, "destroy_s": s, "end": t}` where `end` is time.time() as its script ends.
Then it does what the interpreter does first at exit, in its order (threading._shutdown: the
threading atexit hooks and the join of non-daemon threads; then every atexit function) and prints
`HANDLERS <time.time()>`: end -> HANDLERS is the exit's share that Python code can hold up, measured
alone; the interpreter's own teardown of its modules follows (seconds of CPU for torch on a loaded
2-core machine, with or without Mycroft, and noisy). The launcher that waits for the process reads
the whole interpreter exit as the process's end minus `end`.

Args: --steps N
"""

from __future__ import annotations

import argparse
import atexit
import json
import threading
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(1024)
    for _ in range(args.steps):
        dist.all_reduce(tensor)
        time.sleep(0.01)
    dist.barrier()
    started = time.perf_counter()
    dist.destroy_process_group()
    destroy_s = time.perf_counter() - started
    print("TEARDOWN " + json.dumps({"rank": rank, "destroy_s": destroy_s, "end": time.time()}), flush=True)


def exit_handlers() -> None:
    """The interpreter's first steps at exit, here: then they are timed alone (it skips them later: the
    main thread is marked stopped, the atexit list is empty)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    print(f"HANDLERS {time.time()}", flush=True)


if __name__ == "__main__":
    main()
    exit_handlers()
