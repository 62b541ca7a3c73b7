"""Mycroft's NCCL profiler plugin with no line of configuration.

NCCL loads one profiler plugin, named by NCCL_PROFILER_PLUGIN, when it creates its first
communicator: the instrumentation loads before that (opentelemetry-instrument runs it at
interpreter start, torchrun's workers inherit the environment), so naming the plugin here is
enough for NCCL to load it. A plugin the user named already is kept as Mycroft's chained
plugin (MYCROFT_NCCL_PROFILER_CHAIN: it gets every event, as if loaded alone);
MYCROFT_NCCL_PLUGIN=off leaves NCCL_PROFILER_PLUGIN alone, and NCCL_PROFILER_PLUGIN=none (NCCL's
own "no profiler") is respected.

Everything here is a decision on a mapping: `name_plugin` changes the environment it is given
and says what it did, so it is tested without a process and applied once at start-up.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

PLUGIN_ENV = "NCCL_PROFILER_PLUGIN"
CHAIN_ENV = "MYCROFT_NCCL_PROFILER_CHAIN"
SWITCH_ENV = "MYCROFT_NCCL_PLUGIN"  # "off" (or 0 / false / no): leave NCCL_PROFILER_PLUGIN as the user set it
NAMED_BY_MYCROFT_ENV = "MYCROFT_NCCL_PLUGIN_AUTO"  # "1": NCCL_PROFILER_PLUGIN is Mycroft's doing, not the user's
_OFF = frozenset({"0", "off", "false", "no"})


@dataclass(frozen=True)
class PluginChoice:
    """What name_plugin did: `outcome` is one word for tests and metrics, `message` one log line."""

    outcome: str  # named | chained | kept_ours | kept_none | kept_both | off | missing
    message: str


def is_ours(value: str, plugin: Path) -> bool:
    """Whether NCCL_PROFILER_PLUGIN already names Mycroft's plugin (this build or another copy)."""
    if not value:
        return False
    try:
        if os.path.realpath(value) == os.path.realpath(plugin):
            return True
    except (OSError, ValueError):
        pass
    name = os.path.basename(value)
    return name == "libmycroft_nccl_profiler.so" or name.startswith("_nccl_profiler.")


def name_plugin(env: MutableMapping[str, str], plugin: Path | None) -> PluginChoice:
    """Point NCCL_PROFILER_PLUGIN at `plugin` in `env` unless the user said otherwise (see module doc)."""
    if env.get(SWITCH_ENV, "").strip().lower() in _OFF:
        return PluginChoice("off", f"mycroft: {SWITCH_ENV}=off: NCCL_PROFILER_PLUGIN left as it is")
    current = env.get(PLUGIN_ENV, "").strip()
    if current == "none":
        return PluginChoice("kept_none", "mycroft: NCCL_PROFILER_PLUGIN=none: NCCL's inside is not traced")
    if plugin is None:
        return PluginChoice("missing", "mycroft: the NCCL profiler plugin is not built here (no C compiler at "
                                       "install?): NCCL's inside is not traced; `mycroft native build` builds it")
    if current and is_ours(current, plugin):
        return PluginChoice("kept_ours", "mycroft: NCCL_PROFILER_PLUGIN already names Mycroft's plugin")
    if not current:
        env[PLUGIN_ENV] = str(plugin)
        env[NAMED_BY_MYCROFT_ENV] = "1"
        return PluginChoice("named", f"mycroft: NCCL_PROFILER_PLUGIN={plugin}")
    if env.get(CHAIN_ENV, "").strip():
        return PluginChoice("kept_both", f"mycroft: NCCL_PROFILER_PLUGIN names another plugin ({current}) and "
                                         f"{CHAIN_ENV} is set: both left as they are, NCCL's inside not traced")
    env[CHAIN_ENV] = current
    env[PLUGIN_ENV] = str(plugin)
    env[NAMED_BY_MYCROFT_ENV] = "1"
    return PluginChoice("chained", f"mycroft: NCCL_PROFILER_PLUGIN={plugin}, chained to your {current} "
                                   f"({CHAIN_ENV})")


def named_by_user(env: MutableMapping[str, str] | None = None) -> bool:
    """Whether the user (not Mycroft) named a profiler plugin: only then is NCCL presumed present
    before any NCCL group exists (the runtime's ring lookup)."""
    env = os.environ if env is None else env
    value = env.get(PLUGIN_ENV, "none")
    return value not in ("", "none") and env.get(NAMED_BY_MYCROFT_ENV) != "1"
