"""The benchmark's training loop: a small MLP step plus collectives, timed per step.

Args: --steps N --collectives-per-step K --size ELEMENTS --rate STEPS_PER_S (0 = flat out) --out DIR
      [--ab-block B]: under opentelemetry-instrument, every rank switches the instrumentation
      off and on every B steps (at the same steps), so traced and plain blocks share the
      machine's noise; step times go to steps-<rank>-traced.txt / steps-<rank>-plain.txt.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--collectives-per-step", type=int, default=1)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ab-block", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    buffer = torch.zeros(args.size)
    times = []
    by_mode: dict[str, list[float]] = {"traced": [], "plain": []}
    instrumentor = None
    if args.ab_block:
        from mycroft.instrumentation.instrumentor import MycroftInstrumentor

        instrumentor = MycroftInstrumentor()  # the instance opentelemetry-instrument created
    period = 1.0 / args.rate if args.rate else 0.0
    next_start = time.perf_counter()
    for step in range(args.steps):
        if instrumentor is not None and step % args.ab_block == 0:
            dist.barrier()  # every rank switches at the same step
            traced = (step // args.ab_block) % 2 == 0
            if traced and not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument()
            elif not traced and instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
            dist.barrier()
        if period:
            delay = next_start - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            next_start += period
        started = time.perf_counter()
        model(torch.randn(32, 256)).sum().backward()
        for _ in range(args.collectives_per_step):
            dist.all_reduce(buffer)
        elapsed = time.perf_counter() - started
        times.append(elapsed)
        if instrumentor is not None and step % args.ab_block >= 2:  # skip the switch's first steps
            by_mode["traced" if (step // args.ab_block) % 2 == 0 else "plain"].append(elapsed)
    dist.barrier()
    if instrumentor is not None:
        for mode, values in by_mode.items():
            with open(os.path.join(args.out, f"steps-{rank}-{mode}.txt"), "w") as handle:
                handle.write("\n".join(f"{t:.7f}" for t in values))
    else:
        with open(os.path.join(args.out, f"steps-{rank}.txt"), "w") as handle:
            handle.write("\n".join(f"{t:.7f}" for t in times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
