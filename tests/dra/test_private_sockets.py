"""The sockets of rdmad-dra's gRPC servers, behind the two the kubelet dials
(rdmad/dra/rpc/unix_server.py): in a directory of the endpoint's that only its owner (root, in
production) may enter, and, like the kubelet's two, replaced when a killed plugin left
them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.plugin_process import Plugin, running_plugin

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
SERVICE = "v1.DRAPlugin"


def private_dir(plugin: Plugin) -> Path:
    return plugin.endpoint.parent / "grpc"


async def call_both(plugin: Plugin) -> None:
    """A call on each socket, which starts both gRPC servers."""
    await kubelet.get_info(str(plugin.registration_socket))
    await kubelet.unprepare(str(plugin.endpoint), SERVICE, [A])


async def test_the_grpc_servers_sockets_are_in_a_directory_only_its_owner_may_enter(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        await call_both(plugin)
        mode = private_dir(plugin).stat()
        sockets = sorted(p.name for p in private_dir(plugin).iterdir() if p.is_socket())
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid) == (0o700, os.getuid())
    assert sockets == ["dra.sock", "reg.sock"]


async def test_a_restart_replaces_the_grpc_sockets_a_killed_plugin_left(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        await call_both(plugin)
        plugin.proc.kill()  # no chance to stop its servers
        await plugin.proc.wait()
    assert (private_dir(plugin) / "dra.sock").is_socket()
    assert (private_dir(plugin) / "reg.sock").is_socket()
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        info = await kubelet.get_info(str(plugin.registration_socket))
        (error,) = (await kubelet.unprepare(info.endpoint, SERVICE, [A])).values()
    assert "rdmad is not reachable on its bus" in error, "the new plugin answers"


async def test_sigterm_removes_the_grpc_servers_sockets_and_their_directory(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        await call_both(plugin)
        assert await plugin.stop() == 0
    assert not private_dir(plugin).exists()


async def test_a_server_that_cannot_bind_its_socket_fails_the_call_and_says_why(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with running_plugin(api, bus_address, tmp_path) as plugin:
        (private_dir(plugin) / "reg.sock").mkdir()  # what gRPC cannot bind over
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.get_info(str(plugin.registration_socket))
        await plugin.wait_log("cannot start the gRPC server for ")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
