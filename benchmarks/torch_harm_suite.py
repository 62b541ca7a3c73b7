"""The whole harm suite: `python benchmarks/torch_harm_suite.py [--collector live|down] [--tests ...]`.

Every test of PyTorch's own torch.distributed suite of the installed wheel (DistributedTest._DistTestBase
in torch/testing/_internal/distributed/distributed_test.py: 285 tests in torch 2.13; the CUDA / NCCL
ones skip on a CPU machine), gloo, 2 ranks, spawn, run once plain and once under
`opentelemetry-instrument` the way users load Mycroft, then compared test by test
(tests/harm/torch_suite.py). A test that passes plain and not instrumented is rerun once in both
modes: harm if it does so again, flaky if not. Prints the table (docs/harm_suite.md) and each
differing test with the instrumented failure's last lines; exits 1 on harm.

--collector live (default): a Mycroft OTLP receiver in this process, as a user's collector;
--collector down: OTEL_EXPORTER_OTLP_ENDPOINT at a port where nothing listens.
--selection ci: the CI's selection only (tests/harm/test_torch_distributed_suite.py).
Takes about an hour on 2 busy cores (run it with `nice -n 10`); --json writes every outcome.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mycroft.faults.inject import free_port  # noqa: E402
from mycroft.otlp_server import OtlpReceiver  # noqa: E402
from tests.harm import torch_suite  # noqa: E402


def all_tests() -> list[str]:
    """The test names of the installed torch's class (listed in a child: the import wants the suite's env)."""
    import subprocess

    listed = subprocess.run([sys.executable, "-m", torch_suite.MODULE, "run", "--list"], cwd=str(ROOT),
                            env=torch_suite.otel_environment("http://127.0.0.1:9"), capture_output=True,
                            text=True, check=True)
    return [line for line in listed.stdout.split() if line.startswith("test")]


def probes_of(workdir: Path) -> dict[str, list[dict[str, object]]]:
    """The probe's findings by mode (the probe runs in the last chunk)."""
    found: dict[str, list[dict[str, object]]] = {"plain": [], "instrumented": []}
    for chunk in sorted(workdir.glob("chunk-*"), key=lambda p: int(p.name.split("-")[1])):
        for mode in found:
            found[mode] = torch_suite.probe_findings(chunk, mode) or found[mode]
    return found


def write_json(path: Path, collector: str, wall: float, comparison: torch_suite.Comparison, workdir: Path) -> None:
    path.write_text(json.dumps({
        "collector": collector, "wall_s": round(wall, 1), "probe": probes_of(workdir),
        "cpu_s": {mode: round(run.cpu_s, 1) for mode, run in comparison.runs.items()},
        "harm": comparison.harm, "flaky": comparison.flaky,
        "plain": {n: o.as_json() for n, o in comparison.plain.items()},
        "instrumented": {n: o.as_json() for n, o in comparison.traced.items()}}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collector", choices=("live", "down"), default="live")
    parser.add_argument("--selection", choices=("all", "ci"), default="all")
    parser.add_argument("--tests", nargs="*", help="these tests instead of a selection")
    parser.add_argument("--test-timeout", type=int, default=180, help="seconds before a hung test is failed")
    parser.add_argument("--workdir", help="where the modes' logs and results go (default: a temporary folder)")
    parser.add_argument("--json", help="write every outcome here (rewritten after each chunk)")
    parser.add_argument("--chunk", type=int, default=0,
                        help="run the tests in chunks of this many, both modes per chunk, so that a run cut "
                             "short still compares what it ran (default: all in one chunk)")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="torch-harm-suite-"))
    workdir.mkdir(parents=True, exist_ok=True)
    names = args.tests or (list(torch_suite.CI_SELECTION) if args.selection == "ci" else all_tests())
    names = [torch_suite.PROBE_TEST, *names]  # first: a run cut short still says whether Mycroft loaded
    spans: list[object] = []
    receiver = None
    if args.collector == "live":
        receiver = OtlpReceiver(spans.extend, "127.0.0.1:0", None).start()
        endpoint = f"http://127.0.0.1:{receiver.grpc_port}"
    else:
        endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    print(f"torch harm suite: {len(names) - 1} tests (+ the probe), gloo, {torch_suite.WORLD_SIZE} ranks, "
          f"spawn; collector {args.collector} ({endpoint}); logs in {workdir}", flush=True)
    started = time.monotonic()
    size = args.chunk if args.chunk > 0 else len(names)
    comparison = torch_suite.Comparison({}, {})
    try:
        for first in range(0, len(names), size):
            part = torch_suite.run_suite(names[first:first + size], torch_suite.otel_environment(endpoint),
                                         workdir / f"chunk-{first // size}", test_timeout_s=args.test_timeout)
            comparison = comparison.merged(part)
            print(f"[{time.monotonic() - started:.0f} s] tests {first + 1}-{first + len(part.plain)}: "
                  f"{sum(o.status == torch_suite.PASSED for o in part.plain.values())} passed plain, "
                  f"{sum(o.status == torch_suite.PASSED for o in part.traced.values())} instrumented; "
                  f"harm {part.harm or 0}, flaky {part.flaky or 0}", flush=True)
            if args.json:
                write_json(Path(args.json), args.collector, time.monotonic() - started, comparison, workdir)
    finally:
        if receiver is not None:
            receiver.stop(0)
    wall = time.monotonic() - started

    probes = probes_of(workdir)
    comparison.plain.pop(torch_suite.PROBE_TEST, None)  # ours, not PyTorch's: out of the table
    comparison.traced.pop(torch_suite.PROBE_TEST, None)
    print(comparison.report())
    print(f"\nwall {wall:.0f} s (both modes and the reruns); probe: plain ranks {probes['plain']}, "
          f"instrumented ranks {probes['instrumented']}; spans received {len(spans)}")
    traced_ok = [p.get("patched") for p in probes["instrumented"]] == [True] * torch_suite.WORLD_SIZE
    if not traced_ok:
        print("the instrumented ranks did not carry Mycroft: the comparison says nothing")
    if args.json:
        write_json(Path(args.json), args.collector, wall, comparison, workdir)
    return 1 if comparison.harm or not traced_ok else 0


if __name__ == "__main__":
    sys.exit(main())
