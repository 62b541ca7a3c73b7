#!/usr/bin/env bash
# One entry point for the README's two commands; safe to run again.
#   ./dev.sh demo   - set up, then run the end-to-end demo (traced job, injected fault, RCA verdict)
#   ./dev.sh test   - set up, then run lint, types and the whole test suite
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
  want=$(cat pyproject.toml dev.sh mycroft/_otlp_fast.c rca_service/_fold_fast.c | sha256sum | cut -c1-16)  # the C decoder and fold build with the package
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/python -m pip install -q "$TORCH_PIN"
    .venv/bin/python -m pip install -q -e ".[collector,dev,analysis]"
    # real training libraries the tests run (tests/instrumentation/test_libraries.py), held to the
    # pinned torch; DeepSpeed and torchtitan run there too where installed (examples/frameworks/README.md)
    .venv/bin/python -m pip install -q -c <(echo "$TORCH_PIN") accelerate==1.16.0 megatron-core==0.16.1
    echo "$want" > "$stamp"
  fi
  # native NCCL profiler plugin (C): rebuilt only when its sources change (make), or built
  # directly with the C compiler where make is missing
  if [ -f native/Makefile ]; then
    if command -v make >/dev/null; then make -s -C native >/dev/null; else .venv/bin/mycroft native build >/dev/null; fi
  fi
}

services() {
  # make builds the sanitizer variants of the native test driver
  if ! command -v make >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q make >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q make >/dev/null 2>&1) || true
  fi
  # Alertmanager (Debian package) for the alerting tests; optional when not root.
  if ! command -v prometheus-alertmanager >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -q prometheus-alertmanager >/dev/null 2>&1 \
      || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q prometheus-alertmanager >/dev/null 2>&1)) \
      || echo "note: prometheus-alertmanager could not be installed; its tests will be skipped" >&2
  fi
  # headless Chromium (Debian package) for the incident-page browser tests; optional when not root.
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -q chromium >/dev/null 2>&1 \
      || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
      || echo "note: chromium could not be installed; the browser tests will be skipped" >&2
  fi
  # SLURM and munge (Debian packages) for the single-node cluster the scheduler-action tests
  # start themselves (tests/slurm_cluster.py); optional when not root.
  if ! { command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1 \
      && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
      || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q slurm-wlm munge >/dev/null 2>&1)) \
      || echo "note: slurm-wlm / munge could not be installed; the SLURM cluster tests will be skipped" >&2
  fi
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
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
