"""Contract tests: the kubelet registers rdmad-dra and calls its DRA service, exactly as the
kubelet's plugin watcher and DRA manager do (testbed/dra/kubelet.py speaks their wire format,
built from the kubelet's API definitions, not from the plugin's .proto files)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import running_plugin

CLAIMS = [
    kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma"),
    kubelet.Claim("team-b", "0b9f2c1e-2222-4c3e-9a6e-000000000002", "pod-b-rdma"),
]


async def test_the_kubelet_finds_one_registration_socket_named_after_the_driver(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        found = kubelet.registration_sockets(str(plugin.registry_dir))
    assert found == [str(plugin.registry_dir / "rdma.rdmad.io-reg.sock")]


async def test_get_info_names_a_dra_plugin_its_endpoint_and_its_dra_and_health_services(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        (reg,) = kubelet.registration_sockets(str(plugin.registry_dir))
        info = await kubelet.get_info(reg)
        endpoint_is_served = socket.socket(socket.AF_UNIX).connect_ex(info.endpoint) == 0
    assert info.type == kubelet.DRA_TYPE
    assert info.name == "rdma.rdmad.io"
    assert info.endpoint == str(tmp_path / "plugins" / "rdma.rdmad.io" / "dra.sock")
    assert endpoint_is_served
    assert info.supported_versions == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert kubelet.chosen_service(info) == "v1.DRAPlugin"


async def test_registration_status_from_the_kubelet_is_logged(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        reg = str(plugin.registration_socket)
        await kubelet.notify_registration_status(reg, True)
        await plugin.wait_log("the kubelet registered DRA driver rdma.rdmad.io")
        await kubelet.notify_registration_status(reg, False, "driver name already taken")
        line = await plugin.wait_log("the kubelet refused DRA driver rdma.rdmad.io")
    assert "driver name already taken" in line


async def test_prepare_answers_each_claim_under_both_versions(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        info = await kubelet.get_info(str(plugin.registration_socket))
        errors = {
            service: await kubelet.prepare(info.endpoint, service, CLAIMS)
            for service in kubelet.dra_services(info)
        }
    for by_uid in errors.values():
        assert set(by_uid) == {c.uid for c in CLAIMS}
        for c in CLAIMS:  # the loopback API server has no ResourceClaims here
            assert by_uid[c.uid].startswith(
                f"cannot read ResourceClaim {c.namespace}/{c.name} from the API server: "
                f"get resourceclaim {c.namespace}/{c.name}: 404"
            )


async def test_unprepare_without_rdmad_is_each_claims_error_so_the_kubelet_retries_it(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:  # no rdmad on the bus
        info = await kubelet.get_info(str(plugin.registration_socket))
        for service in kubelet.dra_services(info):
            errors = await kubelet.unprepare(info.endpoint, service, CLAIMS)
            assert set(errors) == {c.uid for c in CLAIMS}
            assert all("rdmad is not reachable on its bus" in e for e in errors.values())


async def test_a_restart_replaces_the_sockets_a_killed_plugin_left(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        plugin.proc.kill()  # no chance to remove its sockets
        await plugin.proc.wait()
    assert plugin.registration_socket.is_socket() and plugin.endpoint.is_socket()
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        info = await kubelet.get_info(str(plugin.registration_socket))
        (error,) = (await kubelet.unprepare(info.endpoint, "v1.DRAPlugin", CLAIMS[:1])).values()
    assert "rdmad is not reachable on its bus" in error, "the new plugin answers"


async def test_sigterm_removes_both_sockets_so_the_kubelet_deregisters_it(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        assert await plugin.stop() == 0
    assert os.listdir(plugin.registry_dir) == []
    assert not plugin.endpoint.exists()
