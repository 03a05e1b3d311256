"""Device health and the port-down taint of rdmad-dra on a real RDMA device: soft-RoCE (rxe)
on a veth, in the 7.3 guest, with the kernel backend. Setting its netdev down takes the
carrier and the rxe port (the kernel's rxe follows its netdev); the kubelet double holds
the health stream open and the loopback API server holds the slices, as in the host's
contract tests (tests/dra/test_health_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.dra.offer import device_name
from rdmad.dra.slices import PORT_DOWN
from testbed.daemon import Client, RdmadProcess
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import DRIVER, NODE
from testbed.dra.plugin_process import running_plugin
from tests.support.rdma import Rxe, known_to_rdmad, sh

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

PLUGIN_START = 300.0  # s: rdmad-dra's imports over 9p, under TCG
CHANGE_S = 5.0  # the host's bound is 1 s (tests/dra); TCG runs Python several times slower


def taints(devices: dict[str, dict[str, object]], name: str) -> object:
    return devices.get(name, {}).get("taints")


async def test_an_rxe_netdev_set_down_is_unhealthy_and_tainted_and_up_again_healthy(
    rdmad: RdmadProcess, client: Client, rxe: Rxe, tmp_path: Path
) -> None:
    await known_to_rdmad(client, rxe.name)
    name = device_name(rxe.name)
    api = ApiServer(NODE, DRIVER)
    with api.running():
        async with (
            running_plugin(api, rdmad.bus_address, tmp_path / "dra", PLUGIN_START) as plugin,
            kubelet.watching_health(str(plugin.endpoint)) as health,
        ):
            report = await health.until(name, "HEALTHY", PLUGIN_START)
            assert report[name].message == f"port 1 is ACTIVE and {rxe.netdev} has carrier"
            sh("ip", "link", "set", rxe.netdev, "down")
            report = await health.until(name, "UNHEALTHY", CHANGE_S)
            assert report[name].message == f"port 1 is DOWN; {rxe.netdev} has no carrier"
            devices = await api.wait_for(lambda d: bool(taints(d, name)), CHANGE_S)
            assert [t["key"] for t in devices[name]["taints"]] == [PORT_DOWN]
            sh("ip", "link", "set", rxe.netdev, "up")
            await health.until(name, "HEALTHY", CHANGE_S)
            await api.wait_for(lambda d: name in d and not taints(d, name), CHANGE_S)
    assert api.invalid == []
