"""Network-level faults on ranks in network namespaces made by the test (bridge + veth):
a link cut (`ip link set down`) and a throttled link (`tc tbf`)."""

from __future__ import annotations

import random

import pytest

from mycroft.faults import netfault
from mycroft.faults.inject import RunResult, local_rca, run_one

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.requires("netns")]


@pytest.mark.parametrize("fault", ["linkdown", "throttle"])
def test_network_fault(fault: str, fault_rng: random.Random) -> None:
    with local_rca() as rca:  # the harness re-binds an in-process service on the bridge
        result: RunResult = run_one(rca, fault, nproc=3, rng=fault_rng, timeout_s=20)
    assert result.correct, (result.note, result.incident)
    assert result.false_alarms == 0
    assert result.detection_s is not None and result.detection_s <= 5.0


def test_topology_is_removed_afterwards() -> None:
    import subprocess

    with netfault.topology(2) as topo:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert topo.ns(0) in names and topo.ns(1) in names
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert topo.ns(0) not in names and topo.bridge not in links
