"""A 3D-parallel (TP x PP x DP) gloo training loop that can inject one fault; a torchrun target.

    opentelemetry-instrument torchrun --nproc-per-node 8 -m mycroft.faults.job3d

Each step runs Megatron's 1F1B pipeline schedule over a few micro-batches: activations go
to the next stage and gradients back with blocking send/recv in the pipeline group; every
forward and backward ends in an all_reduce of the tensor-parallel group; after the
pipeline the gradients are all-reduced (float32) in the data-parallel group, and every few
steps the loss is all-reduced over the world. Compute is simulated (a sleep plus a sliver
of real tensor work). Groups come from dist.new_group with Megatron's layout (TP fastest),
so their names, members and sequence numbers are what a real job's are.

Configured by environment variables (the harness, mycroft/faults/inject.py, sets them):

  job shape      MYCROFT_JOB_LAYOUT (TPxPPxDP, default 2x2x2), MYCROFT_JOB_MICRO_BATCHES
                 (default max(3, PP)), MYCROFT_JOB_STEPS, MYCROFT_JOB_FWD_S / _BWD_S (compute per
                 micro-batch, default 0.015 / 0.025), MYCROFT_JOB_JITTER (relative, default 0.1),
                 MYCROFT_JOB_SPIKE_P / _SPIKE_S (rare compute spikes), MYCROFT_JOB_LOSS_EVERY (5)
  healthy phases MYCROFT_JOB_CKPT_EVERY (steps; rank 0 saves in save_checkpoint() while the
                 rest wait in dist.barrier()), MYCROFT_JOB_CKPT_S (seconds, "2-4" draws per save),
                 MYCROFT_JOB_EVAL_EVERY / _EVAL_S (every rank in evaluate(), then a metrics
                 all_reduce), MYCROFT_JOB_SLOW_RANK / _SLOW_FACTOR (a mildly slower rank)
  the fault      MYCROFT_FAULT (see FAULTS), MYCROFT_FAULT_RANK, MYCROFT_FAULT_TRIGGER
                 (step | time | first), MYCROFT_FAULT_STEP, MYCROFT_FAULT_AT_S (seconds after
                 init_process_group), MYCROFT_FAULT_POSITION (tp | pp | dp | any: before which
                 op), MYCROFT_FAULT_NTH (which such op of the step; random by default),
                 MYCROFT_FAULT_SEED, MYCROFT_FAULT_STRAGGLE_S (extra compute per step,
                 default 0.15), MYCROFT_FAULT_ONSET_FILE (the faulty rank writes the onset,
                 unix s, just before it misbehaves)

Triggers: `step` fires at a random op of the chosen position in that step; `time` fires at
the first op boundary after MYCROFT_FAULT_AT_S (sigkill / sigstop fire from a timer at that
exact instant, wherever the rank is, group creation included); `first` fires right after the
rank's first collective returns.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .layout import Layout, one_f_one_b

FAULTS = ("none", "block", "chain", "sigkill", "sigstop", "straggler", "mismatch_dtype", "mismatch_size",
          "mismatch_op", "deadlock")
PROCESS_FAULTS = ("block", "sigkill", "sigstop")
TRIGGERS = ("step", "time", "first")
POSITIONS = ("tp", "pp", "dp")


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def _seconds(text: str, rng: random.Random) -> float:
    """'3' or a range '2-4' (drawn uniformly each time)."""
    if "-" in text.strip("-"):
        lo, hi = (float(x) for x in text.split("-", 1))
        return rng.uniform(lo, hi)
    return float(text)


def write_onset(path: str, **facts: Any) -> None:
    """Atomically, so the harness never reads half a file."""
    if not path:
        return
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({**facts, "onset": time.time()}))
    tmp.replace(path)


def stuck_in_user_code(seconds: float) -> None:
    """The injected hang: the rank sits here (the stack in its heartbeats says so)."""
    time.sleep(seconds)


def save_checkpoint(state: dict[str, Any], seconds: float) -> None:
    """Rank 0's periodic checkpoint: a real torch.save of a few MB, then storage latency."""
    import torch

    started = time.time()
    with tempfile.NamedTemporaryFile(prefix="mycroft-ckpt-", suffix=".pt") as f:
        torch.save(state, f.name)
    time.sleep(max(0.0, seconds - (time.time() - started)))


def evaluate(model: Any, seconds: float) -> float:
    """An evaluation phase: compute only, no collectives, for `seconds`."""
    import torch

    deadline = time.time() + seconds
    total = 0.0
    while time.time() < deadline:
        total += float(torch.tanh(model[:256]).sum())
        time.sleep(0.02)
    return total


class Job:
    """One rank of the 3D job; `run()` trains and injects."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.layout = Layout.parse(_env("MYCROFT_JOB_LAYOUT", "2x2x2"))
        self.micro_batches = int(_env("MYCROFT_JOB_MICRO_BATCHES", str(max(3, self.layout.pp))))
        self.steps = int(_env("MYCROFT_JOB_STEPS", "40"))
        self.fwd_s = float(_env("MYCROFT_JOB_FWD_S", "0.015"))
        self.bwd_s = float(_env("MYCROFT_JOB_BWD_S", "0.025"))
        self.jitter = float(_env("MYCROFT_JOB_JITTER", "0.1"))
        self.spike_p = float(_env("MYCROFT_JOB_SPIKE_P", "0"))
        self.spike_s = float(_env("MYCROFT_JOB_SPIKE_S", "0.08"))
        self.loss_every = int(_env("MYCROFT_JOB_LOSS_EVERY", "5"))
        self.ckpt_every = int(_env("MYCROFT_JOB_CKPT_EVERY", "0"))
        self.ckpt_s = _env("MYCROFT_JOB_CKPT_S", "2-4")
        self.eval_every = int(_env("MYCROFT_JOB_EVAL_EVERY", "0"))
        self.eval_s = _env("MYCROFT_JOB_EVAL_S", "1-2")
        self.slow_rank = int(_env("MYCROFT_JOB_SLOW_RANK", "-1"))
        self.slow_factor = float(_env("MYCROFT_JOB_SLOW_FACTOR", "1.15"))
        self.numel = int(_env("MYCROFT_JOB_NUMEL", "16384"))

        self.fault = _env("MYCROFT_FAULT", "none")
        if self.fault not in FAULTS:
            raise SystemExit(f"job3d: unknown MYCROFT_FAULT={self.fault!r}; one of {', '.join(FAULTS)}")
        self.fault_rank = int(_env("MYCROFT_FAULT_RANK", "0"))
        self.trigger = _env("MYCROFT_FAULT_TRIGGER", "step")
        if self.trigger not in TRIGGERS:
            raise SystemExit(f"job3d: unknown MYCROFT_FAULT_TRIGGER={self.trigger!r}; one of {', '.join(TRIGGERS)}")
        self.fault_step = int(_env("MYCROFT_FAULT_STEP", "8"))
        self.fault_at_s = float(_env("MYCROFT_FAULT_AT_S", "0.5"))
        self.position = _env("MYCROFT_FAULT_POSITION", "any")
        self.straggle_s = float(_env("MYCROFT_FAULT_STRAGGLE_S", "0.15"))
        self.hold_s = float(_env("MYCROFT_FAULT_HOLD_S", "3600"))
        self.onset_file = _env("MYCROFT_FAULT_ONSET_FILE", "")
        seed = int(_env("MYCROFT_FAULT_SEED", "0"))
        self.rng = random.Random(seed * 7919 + int(_env("RANK", "0")))  # this rank's draws (jitter, strike)
        self.shared = random.Random(seed)  # draws every rank makes alike (phase lengths)

        self.step = 0
        self.fired = False  # the fault has happened (one-shot faults) / started (straggler)
        self.armed = threading.Event()  # time / first triggers: fire at the next op boundary
        self.strike: tuple[str, int] | None = None  # (position, nth occurrence) in the fault step
        self.seen: dict[str, int] = {}

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        dist, torch = self.dist, self.torch
        dist.init_process_group("gloo")
        self.t_init = time.time()
        self.rank = dist.get_rank()
        if dist.get_world_size() != self.layout.world:
            raise SystemExit(f"job3d: layout {self.layout} needs {self.layout.world} ranks, "
                             f"got {dist.get_world_size()}")
        self.me = self.layout.coord(self.rank)
        self.faulty = self.fault != "none" and self.rank == self.fault_rank
        if self.faulty and self.trigger == "time":
            self._arm_timer()  # a block that comes due during group creation strikes before the first op
        # every rank creates every group, in the same order (torch requires it)
        self.tp_group = self._groups("tp", self.layout.tp_groups())
        self.dp_group = self._groups("dp", self.layout.dp_groups())
        self.pp_group = self._groups("pp", self.layout.pp_groups())
        self.next_rank = self.layout.next_stage(self.rank)
        self.prev_rank = self.layout.prev_stage(self.rank)
        self.model = torch.randn(self.numel)
        self.grad = torch.zeros(self.numel)
        self.schedule = one_f_one_b(self.me.pp, self.layout.pp, self.micro_batches)
        self.boundary("groups")

    def _groups(self, kind: str, groups: list[list[int]]) -> Any:
        mine = None
        for i, members in enumerate(groups):
            if len(members) < 2:
                continue
            g = self.dist.new_group(members, group_desc=f"{kind}{i}")
            if self.rank in members:
                mine = g
        return mine

    def _arm_timer(self) -> None:
        delay = max(0.0, self.t_init + self.fault_at_s - time.time())
        if self.fault in ("sigkill", "sigstop"):
            sig = signal.SIGKILL if self.fault == "sigkill" else signal.SIGSTOP

            def strike() -> None:
                self._onset("timer")
                os.kill(os.getpid(), sig)

            timer = threading.Timer(delay, strike)
        else:
            timer = threading.Timer(delay, self.armed.set)
        timer.daemon = True
        timer.start()

    # ------------------------------------------------------------------ the fault
    def _onset(self, where: str) -> None:
        write_onset(self.onset_file, fault=self.fault, rank=self.rank, step=self.step, trigger=self.trigger,
                    position=where, since_init_s=round(time.time() - self.t_init, 3))

    def _plan_strike(self) -> None:
        """Which op of the fault step the fault hits: a random one of the chosen position."""
        counts = {"tp": 0, "pp": 0, "dp": 1 if self.dp_group is not None else 0}
        for action, _ in self.schedule:
            if action in ("fwd", "bwd"):
                counts["tp"] += 1 if self.tp_group is not None else 0
            else:
                counts["pp"] += 1
        options = [p for p in POSITIONS if counts[p]] if self.position == "any" else [self.position]
        options = [p for p in options if counts.get(p)]
        if not options:
            raise SystemExit(f"job3d: rank {self.rank} has no {self.position} op in layout {self.layout}")
        where = self.rng.choice(options)
        nth = int(_env("MYCROFT_FAULT_NTH", "-1"))
        self.strike = (where, nth % counts[where] if nth >= 0 else self.rng.randrange(counts[where]))

    def boundary(self, position: str) -> None:
        """Called before every op (and after init / group creation): where one-shot faults strike."""
        if not self.faulty or self.fired or self.fault in ("straggler", "deadlock") or \
                self.fault.startswith("mismatch"):
            return
        if self.trigger == "step":
            if self.step != self.fault_step or self.strike is None or position != self.strike[0]:
                return
            nth = self.seen.get(position, 0)
            self.seen[position] = nth + 1
            if nth != self.strike[1]:
                return
        elif not self.armed.is_set():
            return
        self.fired = True
        self._onset(position)
        if self.fault in ("block", "chain"):
            stuck_in_user_code(self.hold_s)
        elif self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)

    def after_op(self) -> None:
        if self.faulty and self.trigger == "first" and not self.armed.is_set():
            self.armed.set()

    def _straggling(self) -> bool:
        if not (self.faulty and self.fault == "straggler"):
            return False
        on = self.step >= self.fault_step if self.trigger == "step" else self.armed.is_set()
        if on and not self.fired:
            self.fired = True
            self._onset("compute")
        return on

    # ------------------------------------------------------------------ compute
    def compute(self, seconds: float) -> None:
        if self.rank == self.slow_rank:
            seconds *= self.slow_factor
        if self.jitter:
            seconds *= max(0.0, 1.0 + self.rng.uniform(-self.jitter, self.jitter))
        if self.spike_p and self.rng.random() < self.spike_p:
            seconds += self.spike_s
        if self._straggling():
            seconds += self.straggle_s / (2 * self.micro_batches)  # +straggle_s per step, spread evenly
        time.sleep(seconds)
        self.model.mul_(0.999).add_(0.001)  # a sliver of real tensor work

    def forward_compute(self, x: Any) -> Any:
        self.compute(self.fwd_s)
        return self._tp_all_reduce(x * 0.5 + 0.5)

    def backward_compute(self, g: Any) -> Any:
        self.compute(self.bwd_s)
        self.grad.add_(g)
        return self._tp_all_reduce(g * 0.5)

    # ------------------------------------------------------------------ communication
    def _tp_all_reduce(self, t: Any) -> Any:
        if self.tp_group is None:
            return t
        self.boundary("tp")
        self.dist.all_reduce(t, group=self.tp_group)
        self.after_op()
        return t

    def _send(self, t: Any, dst: int) -> None:
        self.boundary("pp")
        self.dist.send(t, dst, group=self.pp_group)
        self.after_op()

    def _recv(self, src: int) -> Any:
        self.boundary("pp")
        buf = self.torch.empty(self.numel)
        self.dist.recv(buf, src, group=self.pp_group)
        self.after_op()
        return buf

    def _exchange(self, t: Any, peer: int, send_first: bool) -> Any:
        """One send/recv exchange with a neighbour stage (the deadlock fault swaps the order)."""
        if self.faulty and self.fault == "deadlock" and self.step == self.fault_step and not self.fired:
            self.fired = True
            self._onset("pp")
            send_first = not send_first  # both now send first (or both receive first): a cycle
        if send_first:
            self._send(t, peer)
            return self._recv(peer)
        got = self._recv(peer)
        self._send(t, peer)
        return got

    def pipeline_step(self) -> None:
        """Megatron's 1F1B over the micro-batches of one step."""
        inputs: dict[int, Any] = {}
        outputs: dict[int, Any] = {}
        grads: dict[int, Any] = {}
        torch = self.torch
        for action, mb in self.schedule:
            if action == "recv_fwd":
                assert self.prev_rank is not None
                inputs[mb] = self._recv(self.prev_rank)
            elif action == "fwd":
                x = inputs.pop(mb, None)
                outputs[mb] = self.forward_compute(torch.full((self.numel,), float(mb)) if x is None else x)
            elif action == "send_fwd":
                assert self.next_rank is not None
                self._send(outputs.pop(mb), self.next_rank)
            elif action == "send_fwd_recv_bwd":
                assert self.next_rank is not None
                # sends mb's activation, receives the gradient of mb - warmup (1F1B's steady state)
                grads[mb - self._warmup()] = self._exchange(outputs.pop(mb), self.next_rank, send_first=True)
            elif action == "recv_bwd":
                assert self.next_rank is not None
                grads[mb] = self._recv(self.next_rank)
            elif action == "bwd":
                g = grads.pop(mb, None)
                if g is None:  # the last stage: the loss's gradient
                    g = outputs.pop(mb, torch.ones(self.numel))
                grads[mb] = self.backward_compute(g)
            elif action == "send_bwd":
                assert self.prev_rank is not None
                self._send(grads.pop(mb), self.prev_rank)
            elif action == "send_bwd_recv_fwd":
                assert self.prev_rank is not None
                inputs[mb + 1 + self._warmup()] = self._exchange(grads.pop(mb), self.prev_rank, send_first=False)
        outputs.clear()
        grads.clear()

    def _warmup(self) -> int:
        return min(self.layout.pp - self.me.pp - 1, self.micro_batches)

    def dp_all_reduce(self) -> None:
        if self.dp_group is None:
            return
        self.boundary("dp")
        grad = self.grad
        mismatch = self.faulty and self.step == self.fault_step and self.fault.startswith("mismatch")
        group = self.dp_group
        if mismatch:
            self.fired = True
            self._onset("dp")
            if self.fault == "mismatch_dtype":
                self.dist.all_reduce(grad.double(), group=group)  # the others reduce float32
            elif self.fault == "mismatch_size":
                self.dist.all_reduce(self.torch.zeros(2 * grad.numel()), group=group)
            else:  # mismatch_op: a broadcast where the others all_reduce
                self.dist.broadcast(grad, src=self.dist.get_process_group_ranks(group)[0], group=group)
        else:
            self.dist.all_reduce(grad, group=group)
        self.after_op()
        grad.zero_()

    # ------------------------------------------------------------------ phases
    def checkpoint(self) -> None:
        seconds = _seconds(self.ckpt_s, self.shared)
        if self.rank == 0:
            save_checkpoint({"model": self.model.repeat(64), "step": self.step}, seconds)
        self.dist.barrier()

    def evaluation(self) -> None:
        """Every rank evaluates as long as the others (the same batches), give or take its jitter."""
        seconds = _seconds(self.eval_s, self.shared) * (1.0 + self.rng.uniform(-self.jitter, self.jitter) / 2)
        metric = self.torch.tensor([evaluate(self.model, seconds)])
        self.dist.all_reduce(metric)

    def run(self) -> int:
        self.setup()
        if self.faulty and self.trigger == "step" and self.fault in (*PROCESS_FAULTS, "chain"):
            if self.fault == "chain":
                self.position = "tp"  # its TP peer waits in TP, DP peers in DP, the others in PP recv
            self._plan_strike()
        for step in range(1, self.steps + 1):
            self.step = step
            self.seen.clear()
            self.pipeline_step()
            self.dp_all_reduce()
            if self.loss_every and step % self.loss_every == 0:
                loss = self.torch.tensor([float(self.model[:16].sum())])
                self.dist.all_reduce(loss)
            if self.ckpt_every and step % self.ckpt_every == 0:
                self.checkpoint()
            if self.eval_every and step % self.eval_every == 0:
                self.evaluation()
        self.dist.barrier()
        self.dist.destroy_process_group()
        return 0


def main() -> int:
    if _env("MYCROFT_FAULT", "none") == "chain" and Layout.parse(_env("MYCROFT_JOB_LAYOUT", "2x2x2")).tp < 2:
        print("job3d: the chain fault needs TP >= 2", file=sys.stderr)
        return 2
    return Job().run()


if __name__ == "__main__":
    sys.exit(main())
