"""The kubelet's side of the plugin contract, as the kubelet speaks it: its plugin watcher
finds a socket in the registration directory, calls Registration.GetInfo, accepts a plugin
of type DRAPlugin that names a DRA service the kubelet knows, says so with
NotifyRegistrationStatus, then calls the DRA service on the endpoint GetInfo named, by the
service's full gRPC method names (k8s.io/kubernetes pkg/kubelet/pluginmanager and
pkg/kubelet/cm/dra/plugin)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import grpc

from tests.dra import wire

REGISTRATION = "/pluginregistration.Registration/"
DRA_TYPE = "DRAPlugin"
# The kubelet's own list (servicesSupportedByKubelet), newest first, and each service's
# package in its .proto files.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DRA_PACKAGES = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1",
}


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str
    supported_versions: list[str]


def registration_sockets(directory: str) -> list[str]:
    """What the plugin watcher registers: sockets in the directory, skipping dot files."""
    out = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not name.startswith(".") and stat.S_ISSOCK(os.lstat(path).st_mode):
            out.append(path)
    return out


async def _call(channel: grpc.aio.Channel, method: str, request: bytes) -> bytes:
    call = channel.unary_unary(method)  # bytes in, bytes out: the kubelet's encoding is ours
    reply: bytes = await call(request, timeout=10)
    return reply


def chosen_service(info: PluginInfo) -> str:
    """The kubelet's choice: the first service the plugin names that the kubelet knows."""
    for service in info.supported_versions:
        if service in KUBELET_SERVICES:
            return service
    raise AssertionError(f"the kubelet knows none of {info.supported_versions}")


async def get_info(socket_path: str) -> PluginInfo:
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        fields = wire.decode(await _call(channel, REGISTRATION + "GetInfo", b""))
    return PluginInfo(
        wire.string(fields, 1),
        wire.string(fields, 2),
        wire.string(fields, 3),
        wire.strings(fields, 4),
    )


async def notify_registration_status(socket_path: str, registered: bool, error: str = "") -> None:
    request = wire.encode((1, registered), (2, error)) if error else wire.encode((1, registered))
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as channel:
        assert await _call(channel, REGISTRATION + "NotifyRegistrationStatus", request) == b""


@dataclass(frozen=True)
class Claim:
    namespace: str
    uid: str
    name: str

    def encoded(self) -> bytes:
        return wire.encode((1, self.namespace), (2, self.uid), (3, self.name))


def _claims_request(claims: list[Claim]) -> bytes:
    return b"".join(wire.encode((1, c.encoded())) for c in claims)


def _by_uid(reply: bytes) -> dict[str, wire.Fields]:
    """A response's `map<string, ...> claims = 1`: entries of key = 1, value = 2."""
    out = {}
    for entry in wire.messages(wire.decode(reply), 1):
        value = entry.get(2, [b""])[-1]
        assert isinstance(value, bytes)
        out[wire.string(entry, 1)] = wire.decode(value)
    return out


async def prepare(endpoint: str, service: str, claims: list[Claim]) -> dict[str, str]:
    """NodePrepareResources: claim UID -> its error ("" for none)."""
    method = f"/{DRA_PACKAGES[service]}.DRAPlugin/NodePrepareResources"
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        reply = await _call(channel, method, _claims_request(claims))
    return {uid: wire.string(result, 2) for uid, result in _by_uid(reply).items()}


@dataclass(frozen=True)
class PreparedDevice:
    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]


@dataclass(frozen=True)
class Prepared:
    devices: list[PreparedDevice]
    error: str


async def prepare_devices(endpoint: str, service: str, claims: list[Claim]) -> dict[str, Prepared]:
    """NodePrepareResources: claim UID -> its devices (repeated Device devices = 1) and
    error (2)."""
    method = f"/{DRA_PACKAGES[service]}.DRAPlugin/NodePrepareResources"
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        reply = await _call(channel, method, _claims_request(claims))
    return {
        uid: Prepared(
            [
                PreparedDevice(
                    wire.strings(d, 1), wire.string(d, 2), wire.string(d, 3), wire.strings(d, 4)
                )
                for d in wire.messages(result, 1)
            ],
            wire.string(result, 2),
        )
        for uid, result in _by_uid(reply).items()
    }


async def unprepare(endpoint: str, service: str, claims: list[Claim]) -> dict[str, str]:
    """NodeUnprepareResources: claim UID -> its error ("" for none)."""
    method = f"/{DRA_PACKAGES[service]}.DRAPlugin/NodeUnprepareResources"
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        reply = await _call(channel, method, _claims_request(claims))
    return {uid: wire.string(result, 1) for uid, result in _by_uid(reply).items()}
