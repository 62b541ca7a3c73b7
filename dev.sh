#!/usr/bin/env bash
# One entry point for the README's two commands; safe to run again.
#   ./dev.sh demo   - set up, then run the end-to-end demo (traced job, injected fault, RCA verdict)
#   ./dev.sh test   - set up, then run lint, types and the whole test suite
#   ./dev.sh quick  - the subset for every edit (< 2 min): ruff, then the in-process tests, fuzzers left out
#   ./dev.sh setup  - only set up (.venv, packages, native plugin, test services)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
TORCH_PIN="torch==2.13.0"   # the CPU build; users bring their own torch (pyproject keeps a range)

setup() {
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
  fi
  local stamp=.venv/.mycroft-setup
  local want
  want=$(cat pyproject.toml dev.sh mycroft/_otlp_fast.c rca_service/ingest/_fold_fast.c instrumentation/_hotpath.c | sha256sum | cut -c1-16)  # the C decoder and fold build with the package
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q "$TORCH_PIN"
    .venv/bin/python -m pip install -q -e ".[collector,dev,analysis]"
    # real training libraries the tests run (tests/instrumentation/test_libraries.py), held to the
    # pinned torch (examples/frameworks/README.md): DeepSpeed is an sdist built without its ops (the
    # CPU accelerator JIT-builds its shm comm at first init); torchtitan's pinned deps (datasets,
    # wandb, ...) serve only its Trainer, which the test does not use: its models import triton
    .venv/bin/python -m pip install -q -c <(echo "$TORCH_PIN") accelerate==1.16.0 megatron-core==0.16.1 lightning==2.6.6 transformers==5.25.0
    DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --no-build-isolation -c <(echo "$TORCH_PIN") deepspeed==0.19.8
    .venv/bin/python -m pip install -q --no-deps -c <(echo "$TORCH_PIN") torchtitan==0.3.0
    .venv/bin/python -m pip install -q -c <(echo "$TORCH_PIN") spmd_types==0.2.3 tyro==1.0.17 triton==3.9.0
    # Ray: the launcher tests run real Ray actors (tests/instrumentation/test_launchers.py)
    .venv/bin/python -m pip install -q -c <(echo "$TORCH_PIN") ray==2.60.0
    echo "$want" > "$stamp"
  fi
  # native NCCL profiler plugin (C): rebuilt only when its sources change (make), or built
  # directly with the C compiler where make is missing
  if [ -f native/Makefile ]; then
    if command -v make >/dev/null; then make -s -C native >/dev/null; else .venv/bin/mycroft native build >/dev/null; fi
  fi
}

# Debian packages the tests run for real, as "command:package". ./dev.sh setup installs the missing
# ones as root with apt-get; what it cannot install it names, since under ./dev.sh test and CI
# (CI=true) a test whose component is missing fails naming it (tests/components.py), not skips.
SYSTEM_PACKAGES=(
  make:make                                        # the sanitizer variants of the native test driver
  prometheus-alertmanager:prometheus-alertmanager  # the real Alertmanager round trip (tests/rca/test_alerts.py)
  amtool:prometheus-alertmanager                   # the alert template check (tests/rca/test_dashboards.py)
  chromium:chromium                                # headless browser of the incident-page tests
  ip:iproute2 tc:iproute2                          # network namespaces, link cuts, throttles (test_netfaults.py)
  slurmctld:slurm-wlm slurmd:slurm-wlm munged:munge  # the single-node SLURM cluster (tests/slurm_cluster.py)
)

missing_packages() {
  local pair wanted=()
  for pair in "${SYSTEM_PACKAGES[@]}"; do
    if ! command -v "${pair%%:*}" >/dev/null 2>&1 && [[ " ${wanted[*]} " != *" ${pair#*:} "* ]]; then
      wanted+=("${pair#*:}")
    fi
  done
  echo "${wanted[@]}"
}

services() {
  local missing pkg
  missing=$(missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086  # one word per package
    if ! apt-get install -y -q $missing >/dev/null 2>&1; then
      apt-get update -q >/dev/null 2>&1 || true
      for pkg in $missing; do  # one at a time: one unavailable package must not keep the others out
        apt-get install -y -q "$pkg" >/dev/null 2>&1 || true
      done
    fi
    missing=$(missing_packages)
    [ -z "$missing" ] && return 0
    echo "dev.sh: could not install the Debian package(s) $missing with apt-get." >&2
  else
    echo "dev.sh: not root with apt-get: cannot install the Debian package(s) $missing." >&2
  fi
  echo "dev.sh: the tests that need them FAIL under ./dev.sh test and CI (they skip under a plain pytest);" \
       "install them, e.g. as root: apt-get install $missing" >&2
}

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup; services ;;
  demo)
    setup
    exec .venv/bin/mycroft demo "$@" ;;
  test)
    setup; services
    .venv/bin/ruff check .
    .venv/bin/mypy mycroft instrumentation native collector_processor rca_service
    # a missing real component fails its tests here (tests/components.py); line and branch
    # coverage of the pytest process, its total printed at the end (docs/testing.md)
    # the floor (fail_under) holds for the whole suite; a run of a part (arguments given) only reports
    floor=()
    [ $# -gt 0 ] && floor=(--cov-fail-under=0)
    MYCROFT_TEST_STRICT=1 exec .venv/bin/python -m pytest -q -p no:cacheprovider \
      --cov --cov-report=term:skip-covered "${floor[@]}" "$@" ;;
  quick)
    setup
    .venv/bin/ruff check .
    # in-process only (tests/conftest.py fails a test not marked slow that starts a process), no fuzzers:
    # what an edit can break in seconds; ./dev.sh test runs everything (docs/testing.md)
    exec .venv/bin/python -m pytest -q -p no:cacheprovider -x -m "not slow and not fuzz" "$@" ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
