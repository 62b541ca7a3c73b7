"""NCCL_PROFILER_PLUGIN named by the instrumentation itself: no line of configuration for NCCL's inside."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mycroft.instrumentation.nccl_plugin import (
    CHAIN_ENV,
    NAMED_BY_MYCROFT_ENV,
    PLUGIN_ENV,
    SWITCH_ENV,
    name_plugin,
    named_by_user,
)

from tests.conftest import BIN, REPO

PLUGIN = Path("/opt/site/mycroft/native/_nccl_profiler.cpython-311-x86_64-linux-gnu.so")


def test_unset_is_named_and_marked_as_mycrofts_doing() -> None:
    env: dict[str, str] = {}
    assert name_plugin(env, PLUGIN).outcome == "named"
    assert env == {PLUGIN_ENV: str(PLUGIN), NAMED_BY_MYCROFT_ENV: "1"}
    assert not named_by_user(env)  # a gloo-only rank does not go looking for a ring


def test_a_users_plugin_becomes_the_chained_one() -> None:
    env = {PLUGIN_ENV: "/opt/inspector/libnccl-profiler-inspector.so"}
    choice = name_plugin(env, PLUGIN)
    assert choice.outcome == "chained" and "inspector" in choice.message
    assert env[PLUGIN_ENV] == str(PLUGIN) and env[CHAIN_ENV] == "/opt/inspector/libnccl-profiler-inspector.so"


@pytest.mark.parametrize("value", [str(PLUGIN), "/elsewhere/libmycroft_nccl_profiler.so"])
def test_mycrofts_own_plugin_is_never_chained_to_itself(value: str) -> None:
    env = {PLUGIN_ENV: value}
    assert name_plugin(env, PLUGIN).outcome == "kept_ours"
    assert env == {PLUGIN_ENV: value} and named_by_user(env)


@pytest.mark.parametrize("switch", ["off", "0", "FALSE", "no"])
def test_one_variable_turns_it_off(switch: str) -> None:
    env = {SWITCH_ENV: switch}
    assert name_plugin(env, PLUGIN).outcome == "off" and env == {SWITCH_ENV: switch}


def test_nccls_own_none_and_a_set_chain_are_respected() -> None:
    none = {PLUGIN_ENV: "none"}
    assert name_plugin(none, PLUGIN).outcome == "kept_none" and none == {PLUGIN_ENV: "none"}
    both = {PLUGIN_ENV: "/x/other.so", CHAIN_ENV: "/y/third.so"}
    assert name_plugin(both, PLUGIN).outcome == "kept_both" and both == {PLUGIN_ENV: "/x/other.so",
                                                                         CHAIN_ENV: "/y/third.so"}


def test_no_built_plugin_changes_nothing_and_says_how_to_build_it() -> None:
    env: dict[str, str] = {}
    choice = name_plugin(env, None)
    assert choice.outcome == "missing" and "mycroft native build" in choice.message and env == {}


def _environment_seen_by(extra: dict[str, str], drop: tuple[str, ...] = ()) -> dict[str, str]:
    """What a script started by `opentelemetry-instrument python` sees, with torch.distributed loaded."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in (PLUGIN_ENV, CHAIN_ENV, SWITCH_ENV, *drop)}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", **extra)
    script = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
              "if 'PROFILER' in k or k.startswith('MYCROFT_NCCL')}))")
    done = subprocess.run([str(BIN / "opentelemetry-instrument"), str(BIN / "python"), "-c", script], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_opentelemetry_instrument_names_the_built_plugin_and_chains_the_users() -> None:
    from mycroft.native import installed_plugin

    plugin = installed_plugin()
    assert plugin is not None and plugin.is_file(), "the plugin is built by ./dev.sh setup and by pip install"
    seen = _environment_seen_by({})
    assert seen[PLUGIN_ENV] == str(plugin) and seen[NAMED_BY_MYCROFT_ENV] == "1"
    chained = _environment_seen_by({PLUGIN_ENV: "/opt/inspector/libnccl-profiler-inspector.so"})
    assert chained[PLUGIN_ENV] == str(plugin)
    assert chained[CHAIN_ENV] == "/opt/inspector/libnccl-profiler-inspector.so"
    off = _environment_seen_by({SWITCH_ENV: "off"})
    assert PLUGIN_ENV not in off
