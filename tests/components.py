"""The real components the suite runs, what installs each, and whether this machine has it.

A test that needs one carries ``@pytest.mark.requires("name")`` (or calls ``require("name")``).
Where the component is missing the test skips on a developer's plain ``pytest`` run, and fails
naming what to install under ``CI=true`` or ``./dev.sh test`` (which sets MYCROFT_TEST_STRICT=1):
a green CI then means that the tests of every capability ran, not that some quietly did not.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import pytest

STRICT_ENV = "MYCROFT_TEST_STRICT"


def _command(*names: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        if any(shutil.which(name) for name in names):
            return None
        return f"`{names[0]}` is not on PATH"
    return missing


def _module(name: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        return None if importlib.util.find_spec(name) is not None else f"Python module `{name}` is not installed"
    return missing


def _netns() -> str | None:
    from mycroft.faults import netfault

    return netfault.available()


def _slurm() -> str | None:
    from tests.slurm_cluster import missing_requirements

    return missing_requirements()


@dataclass(frozen=True)
class Component:
    name: str
    missing: Callable[[], str | None]  # why it cannot run here, or None
    install: str  # what to do about it


COMPONENTS: dict[str, Component] = {c.name: c for c in (
    Component("chromium", _command("chromium", "chromium-browser"),
              "apt-get install chromium (./dev.sh setup does it as root)"),
    Component("alertmanager", _command("prometheus-alertmanager", "alertmanager"),
              "apt-get install prometheus-alertmanager (./dev.sh setup does it as root)"),
    Component("amtool", _command("amtool"),
              "apt-get install prometheus-alertmanager, which ships amtool (./dev.sh setup does it as root)"),
    Component("netns", _netns,
              "run the tests as root, with iproute2 installed (apt-get install iproute2; ./dev.sh setup does it)"),
    Component("slurm", _slurm,
              "run the tests as root, with apt-get install slurm-wlm munge (./dev.sh setup does it as root)"),
    Component("pandas", _module("pandas"), "pip install -e '.[analysis]' (./dev.sh setup does it)"),
    Component("ray", _module("ray"), "pip install ray==2.60.0 (./dev.sh setup does it)"),
    *(Component(module, _module(module), f"{how} (./dev.sh setup does it; examples/frameworks/README.md)")
      for module, how in (
          ("accelerate", "pip install -c <(echo torch==2.13.0) accelerate==1.16.0"),
          ("megatron.core", "pip install -c <(echo torch==2.13.0) megatron-core==0.16.1"),
          ("lightning", "pip install -c <(echo torch==2.13.0) lightning==2.6.6"),
          ("transformers", "pip install -c <(echo torch==2.13.0) transformers==5.25.0"),
          ("deepspeed", "DS_BUILD_OPS=0 pip install --no-build-isolation -c <(echo torch==2.13.0) deepspeed==0.19.8"),
          ("torchtitan", "pip install --no-deps torchtitan==0.3.0 && pip install spmd_types==0.2.3 tyro==1.0.17 "
                         "triton==3.9.0"))),
)}


def strict() -> bool:
    """Whether a missing component fails the test (CI, ./dev.sh test) instead of skipping it."""
    return os.environ.get("CI", "").lower() in ("true", "1") or os.environ.get(STRICT_ENV) == "1"


def missing(name: str) -> str | None:
    """Why component `name` cannot run here, with what installs it; None when it can."""
    component = COMPONENTS[name]  # a KeyError here is a typo in a test's marker
    why = component.missing()
    return None if why is None else f"{name} is missing ({why}): {component.install}"


def require(name: str) -> None:
    """Skip (developer run) or fail (CI / ./dev.sh test) when component `name` is missing."""
    why = missing(name)
    if why is None:
        return
    if strict():
        pytest.fail(f"{why}. Under CI=true / ./dev.sh test a missing component fails rather than skips.",
                    pytrace=False)
    pytest.skip(why)
