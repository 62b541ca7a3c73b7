"""The harm suite's driver: PyTorch's own torch.distributed tests, plain and under Mycroft, test by test.

The test bodies are the installed wheel's (torch/testing/_internal/distributed/distributed_test.py),
run the way PyTorch's test/distributed/test_distributed_spawn.py runs them: BACKEND=gloo,
WORLD_SIZE=2, a TEMP_DIR holding `barrier/`, INIT_METHOD=file://..., and one test class of
TestDistBackend + DistributedTest._DistTestBase whose every test spawns its 2 ranks
(tests/harm/torch_cases.py). One mode is one process running the selection in a row:

    python -m tests.harm.torch_suite run --out plain.json test_barrier test_all_reduce_sum ...
    opentelemetry-instrument python -m tests.harm.torch_suite run --out traced.json test_barrier ...

the second the way users load Mycroft (zero-code; the spawned ranks inherit it through
opentelemetry-instrument's sitecustomize, as a user's mp.spawn workers do), with the same OTEL_*
environment in both. `run_suite` runs both modes and compares: a test that passes plain and does not
pass instrumented is harm, once it does so again when both modes run it a second time (otherwise it
is reported as flaky). Skipped-both and failed-both are reported, not harm.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(sys.executable).parent
MODULE = "tests.harm.torch_suite"
WORLD_SIZE = 2
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
PROBE_TEST = "test_zz_mycroft_harm_probe"  # ours (tests/harm/torch_cases.py): are the ranks traced?
PROBE_DIR_ENV = "MYCROFT_HARM_PROBE_DIR"  # where the probe's ranks write what they found

# The CI selection (tests/harm/test_torch_distributed_suite.py): one or a few tests of each kind.
CI_SELECTION: tuple[str, ...] = (
    # DDP on CPU: save / deepcopy of the model (also with grads as bucket views), a comm hook whose
    # future chains .then(), static graph
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_static_graph_api_cpu",
    # collectives of every kind, on the default group and on new_group()s; coalesced, sparse
    "test_all_reduce_coalesced_full_group_sum",
    "test_broadcast_full_group",
    "test_reduce_product",
    "test_all_gather_coalesced_simple",
    "test_gather_full_group",
    "test_scatter",
    "test_sparse_all_reduce_sum",
    # async ops and their futures
    "test_all_reduce_sum_async",
    "test_get_future",
    # p2p: isend / irecv, batched, send / recv under the profiler
    "test_isend",
    "test_batch_isend_irecv_gloo",
    "test_send_recv_torch_profiler",
    # barrier on a new_group(), object collectives on a subgroup
    "test_barrier_full_group",
    "test_all_gather_object_subgroup",
    # errors and timeouts: a barrier timing out, a monitored barrier naming the missing rank
    "test_barrier_timeout_global",
    "test_monitored_barrier_gloo_subgroup",
)


@dataclass
class Outcome:
    status: str  # passed / failed / skipped
    seconds: float
    detail: str = ""  # the failure's traceback (its tail) or the skip's reason

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "seconds": round(self.seconds, 2), "detail": self.detail}


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ---- inside one mode's process --------------------------------------------------------------

def suite_environment(temp_dir: str, timeout_s: int) -> dict[str, str]:
    """What test_distributed_spawn.py requires (and PyTorch's run_test.py sets for gloo's file:// run)."""
    return {"BACKEND": "gloo", "WORLD_SIZE": str(WORLD_SIZE), "TEMP_DIR": temp_dir,
            "INIT_METHOD": "file://" + os.path.join(temp_dir, "init_dir", "shared_init_file"),
            # a hung test is failed (its ranks killed) after this long, not after torch's 300 s
            "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(timeout_s),
            "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"}  # the repro line names our module, not a command


class _Collector(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.status, self.detail = PASSED, ""

    def addError(self, test: Any, err: Any) -> None:
        self.status, self.detail = FAILED, tail("".join(traceback.format_exception(*err)), 60)

    def addFailure(self, test: Any, err: Any) -> None:
        self.addError(test, err)

    def addSkip(self, test: Any, reason: str) -> None:
        self.status, self.detail = SKIPPED, reason

    def addUnexpectedSuccess(self, test: Any) -> None:
        self.status, self.detail = FAILED, "unexpected success"


def list_tests() -> list[str]:
    from tests.harm import torch_cases

    return sorted(name for name in dir(torch_cases.TestDistBackendWithSpawn)
                  if name.startswith("test") and name != PROBE_TEST)


def known_skip(test: Any) -> str | None:
    """Why the ranks of this test would skip on this machine before its body runs (a decorator that
    exits the rank: no CUDA, a world size too small), else None. Such a test is recorded as skipped
    without spawning its ranks, the same way in both modes: a third of the suite on a CPU machine."""
    import inspect

    import torch

    if getattr(test, "__unittest_skip__", False):
        return None  # unittest skips it with its own reason, without spawning
    accelerator = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", WORLD_SIZE))
    while test is not None:
        code = getattr(test, "__code__", None)
        where = code.co_qualname if code is not None else ""
        if not accelerator and where.startswith("skip_if_no_gpu."):
            return "needs CUDA (skip_if_no_gpu; not spawned)"
        if not accelerator and where.startswith("skip_if_lt_x_gpu."):
            found = inspect.getclosurevars(test).nonlocals
            if not found.get("allow_cpu"):
                return f"needs {found.get('x')} CUDA devices (skip_if_lt_x_gpu; not spawned)"
        if where.startswith("skip_if_small_worldsize.") and world < 8:
            return "needs a world size of 8 (skip_if_small_worldsize; not spawned)"
        if where.startswith("skip_if_odd_worldsize.") and world % 2:
            return "needs an even world size (skip_if_odd_worldsize; not spawned)"
        test = getattr(test, "__wrapped__", None)
    return None


def run_in_process(names: Sequence[str], out: Path) -> None:
    """Runs the tests one after another in this process (each spawns its ranks); the JSON is
    rewritten after each test, so a run killed midway still says what it did."""
    from tests.harm import torch_cases

    cls = torch_cases.TestDistBackendWithSpawn
    results: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        collector = _Collector()
        try:
            reason = known_skip(getattr(cls, name))
            if reason:
                collector.status, collector.detail = SKIPPED, reason
            else:
                cls(name).run(collector)
        except Exception:  # a test that cannot even be built (a name this torch lacks)
            collector.status, collector.detail = FAILED, tail(traceback.format_exc())
        outcome = Outcome(collector.status, time.monotonic() - started, collector.detail)
        results[name] = outcome.as_json()
        print(f"harm-suite {name} {outcome.status} {outcome.seconds:.1f}s", flush=True)
        scratch = out.with_suffix(".tmp")
        scratch.write_text(json.dumps(results, indent=1))
        scratch.replace(out)


def _main_run(args: argparse.Namespace) -> int:
    names = list(args.tests)
    if args.tests_file:
        names += Path(args.tests_file).read_text().split()
    temp_dir = tempfile.mkdtemp(prefix="harm-suite-")
    os.makedirs(os.path.join(temp_dir, "barrier"), exist_ok=True)
    os.environ.update(suite_environment(temp_dir, args.timeout))
    sys.argv = sys.argv[:1]  # torch's common_utils parses sys.argv at import; the ranks inherit it too
    if args.list:
        print("\n".join(list_tests()))
        return 0
    run_in_process(names or list_tests(), Path(args.out))
    return 0


# ---- outside: both modes, the comparison ----------------------------------------------------

def otel_environment(endpoint: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A user's environment for a job under opentelemetry-instrument (the same in both modes)."""
    env = dict(os.environ if base is None else base)
    env.update(OTEL_SERVICE_NAME="torch-harm-suite", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
               OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_TRACES_EXPORTER="otlp",
               OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def mode_command(out: Path, tests_file: Path, instrumented: bool, timeout_s: int) -> list[str]:
    command = [sys.executable, "-m", MODULE, "run", "--out", str(out), "--tests-file", str(tests_file),
               "--timeout", str(timeout_s)]
    return [str(BIN / "opentelemetry-instrument"), *command] if instrumented else command


@dataclass
class ModeRun:
    outcomes: dict[str, Outcome]
    wall_s: float
    cpu_s: float  # user + system of the driver and its ranks: the firmer figure on a shared machine
    returncode: int | None = 0  # the driver's (None: killed at the mode's cap)
    log_tail: str = ""  # the driver's last lines where it did not exit 0


def run_mode(names: Sequence[str], instrumented: bool, env: Mapping[str, str], workdir: Path,
             test_timeout_s: int = 120, total_timeout_s: float | None = None, label: str = "") -> ModeRun:
    """One mode's results by test; a test the run never reached (killed at total_timeout_s) is absent."""
    mode = label or ("instrumented" if instrumented else "plain")
    workdir.mkdir(parents=True, exist_ok=True)
    tests_file, out, log = workdir / f"{mode}.tests", workdir / f"{mode}.json", workdir / f"{mode}.log"
    tests_file.write_text("\n".join(names))
    out.unlink(missing_ok=True)
    probe = workdir / f"probe-{mode}"
    probe.mkdir(exist_ok=True)
    for old in probe.glob("*.json"):
        old.unlink()
    env = {**env, PROBE_DIR_ENV: str(probe)}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    with log.open("w") as log_file, subprocess.Popen(
            mode_command(out, tests_file, instrumented, test_timeout_s), env=dict(env), cwd=str(REPO),
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True) as process:
        returncode: int | None = None
        try:
            returncode = process.wait(timeout=total_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        finally:
            try:  # ranks still alive (a test killed midway) go with their driver
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    data = json.loads(out.read_text()) if out.exists() else {}
    outcomes = {name: Outcome(v["status"], v["seconds"], v["detail"]) for name, v in data.items()}
    return ModeRun(outcomes, wall, cpu, returncode,
                   "" if returncode == 0 else tail(log.read_text(errors="replace"), 30))


def probe_findings(workdir: Path, mode: str) -> list[dict[str, Any]]:
    """What each rank of the probe test found: {"rank", "loaded", "patched"}."""
    return [json.loads(path.read_text()) for path in sorted((workdir / f"probe-{mode}").glob("probe-*.json"))]


@dataclass
class Comparison:
    plain: dict[str, Outcome]
    traced: dict[str, Outcome]
    runs: dict[str, ModeRun] = field(default_factory=dict)  # by mode: plain, instrumented and the reruns
    harm: list[str] = field(default_factory=list)  # passed plain, not instrumented, twice
    flaky: list[str] = field(default_factory=list)  # differed once, not on the second run
    reruns: dict[str, tuple[Outcome, Outcome]] = field(default_factory=dict)

    def merged(self, other: Comparison) -> Comparison:
        """Two chunks' comparisons as one (run times added by mode)."""
        runs = dict(self.runs)
        for mode, run in other.runs.items():
            mine = runs.get(mode)
            runs[mode] = run if mine is None else ModeRun({**mine.outcomes, **run.outcomes},
                                                          mine.wall_s + run.wall_s, mine.cpu_s + run.cpu_s)
        return Comparison({**self.plain, **other.plain}, {**self.traced, **other.traced}, runs,
                          self.harm + other.harm, self.flaky + other.flaky, {**self.reruns, **other.reruns})

    def names(self) -> list[str]:
        return sorted(set(self.plain) | set(self.traced))

    def both(self, status: str) -> list[str]:
        return [n for n in self.names() if n in self.plain and n in self.traced
                and self.plain[n].status == self.traced[n].status == status]

    def differing(self) -> list[str]:
        """Any test whose outcome differs between the modes (harm candidates and the odd others)."""
        return [n for n in self.names() if n in self.plain and n in self.traced
                and self.plain[n].status != self.traced[n].status]

    def missing(self) -> list[str]:
        return [n for n in self.names() if (n in self.plain) != (n in self.traced)]

    def table(self) -> str:
        run = [n for n in self.names() if n in self.plain and n in self.traced]
        plain_passed = sum(self.plain[n].status == PASSED for n in run)
        traced_passed = sum(self.traced[n].status == PASSED for n in run)
        spawned = [n for n in run if "not spawned" not in self.plain[n].detail]
        plain_s = sum(self.plain[n].seconds for n in run)
        traced_s = sum(self.traced[n].seconds for n in run)
        cpu = " / ".join(f"{self.runs[m].cpu_s:.0f}" for m in ("plain", "instrumented") if m in self.runs)
        rows = [("tests run", len(run)), ("passed plain", plain_passed), ("passed instrumented", traced_passed),
                ("differing", len(self.differing())), ("harm (differing twice)", len(self.harm)),
                ("flaky (differing once)", len(self.flaky)), ("skipped both", len(self.both(SKIPPED))),
                ("failed both", len(self.both(FAILED))), ("run in one mode only", len(self.missing())),
                ("tests whose ranks were spawned", len(spawned)),
                ("tests' wall plain / instrumented (s)", f"{plain_s:.0f} / {traced_s:.0f}"),
                ("CPU plain / instrumented (s)", cpu or "-")]
        return "\n".join(["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)])

    def report(self) -> str:
        lines = [self.table(), ""]
        for name in self.differing():
            verdict = "HARM" if name in self.harm else "flaky" if name in self.flaky else "differs"
            lines.append(f"{verdict}: {name}: plain {self.plain[name].status}, "
                         f"instrumented {self.traced[name].status}")
            detail = self.traced[name].detail if self.traced[name].status != PASSED else self.plain[name].detail
            lines.extend("    " + line for line in tail(detail, 25).splitlines())
        for name in self.both(FAILED):
            lines.append(f"failed both: {name}: {tail(self.plain[name].detail, 1)}")
        for name in self.missing():
            lines.append(f"run in one mode only (the other was cut short): {name}")
        for mode, run in self.runs.items():
            if run.returncode != 0:
                ended = "killed at its cap" if run.returncode is None else f"exited {run.returncode}"
                lines.append(f"the {mode} driver {ended}; its last lines:")
                lines.extend("    " + line for line in run.log_tail.splitlines())
        return "\n".join(lines)


def run_suite(names: Sequence[str], env: Mapping[str, str], workdir: Path, test_timeout_s: int = 120,
              total_timeout_s: float | None = None, retry: bool = True) -> Comparison:
    """Both modes, one after the other (the machine's cores to one mode at a time), then each test
    that passed plain and not instrumented once more in both modes: harm if it does so again."""
    runs = {"plain": run_mode(names, False, env, workdir, test_timeout_s, total_timeout_s)}
    runs["instrumented"] = run_mode(names, True, env, workdir, test_timeout_s, total_timeout_s)
    comparison = Comparison(runs["plain"].outcomes, runs["instrumented"].outcomes, runs)
    candidates = [n for n in comparison.differing() if comparison.plain[n].status == PASSED]
    if candidates and retry:
        runs["plain-rerun"] = run_mode(candidates, False, env, workdir, test_timeout_s, label="plain-rerun")
        runs["instrumented-rerun"] = run_mode(candidates, True, env, workdir, test_timeout_s,
                                              label="instrumented-rerun")
        for name in candidates:
            first = runs["plain-rerun"].outcomes.get(name)
            second = runs["instrumented-rerun"].outcomes.get(name)
            if first is None or second is None:
                comparison.flaky.append(name)
                continue
            comparison.reruns[name] = (first, second)
            (comparison.harm if first.status == PASSED and second.status != PASSED else comparison.flaky).append(name)
    else:
        comparison.harm.extend(candidates)
    return comparison


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run tests in this process (one mode; the launcher decides which)")
    run.add_argument("tests", nargs="*", help="test names (default: every test of the class)")
    run.add_argument("--tests-file", help="a file of test names, whitespace-separated")
    run.add_argument("--out", default="harm-suite.json")
    run.add_argument("--timeout", type=int, default=120, help="seconds before a hung test's ranks are killed")
    run.add_argument("--list", action="store_true", help="print the test names and exit")
    args = parser.parse_args(argv)
    return _main_run(args)


if __name__ == "__main__":
    sys.exit(main())
