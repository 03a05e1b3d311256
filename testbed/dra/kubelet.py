"""The kubelet's side of the plugin contract, as the kubelet speaks it: its plugin watcher
finds a socket in the registration directory, calls Registration.GetInfo, accepts a plugin
of type DRAPlugin that names a DRA service the kubelet knows, says so with
NotifyRegistrationStatus, then calls the DRA service on the endpoint GetInfo named, by the
service's full gRPC method names (k8s.io/kubernetes pkg/kubelet/pluginmanager and
pkg/kubelet/cm/dra/plugin)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from testbed.dra import wire

REGISTRATION = "/pluginregistration.Registration/"
DRA_TYPE = "DRAPlugin"
# The kubelet's own list (servicesSupportedByKubelet), newest first, and each service's
# package in its .proto files.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DRA_PACKAGES = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1",
}
# The kubelet's device health services (dra-health/v1 and v1alpha1), each its own package.
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
HEALTH = {0: "UNKNOWN", 1: "HEALTHY", 2: "UNHEALTHY"}  # HealthStatus
# The kubelet's bound on each DRA call (PluginClientTimeout); a plugin's answer past it is
# lost, and the kubelet calls again.
DRA_CALL_TIMEOUT = 45.0
REGISTRATION_TIMEOUT = 10.0


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


# The kubelet's gRPC (grpc-go) sends its flow-control (BDP) ping on receipt of data, in
# the same instant as the plugin's message; grpcio's sends it from a timer, up to ~10 s
# after the data, which would wake an idle plugin long after its last message. Off, no
# ping reaches the plugin at a time the kubelet's would not.
CHANNEL_OPTIONS = [("grpc.http2.bdp_probe", 0)]


def connect(socket_path: str) -> grpc.aio.Channel:
    """A channel to one of the plugin's sockets; the kubelet may close it at any time."""
    return grpc.aio.insecure_channel(f"unix:{socket_path}", options=CHANNEL_OPTIONS)


def _start(
    channel: grpc.aio.Channel, method: str, request: bytes, timeout: float
) -> grpc.aio.UnaryUnaryCall[bytes, bytes]:
    call = channel.unary_unary(method)  # bytes in, bytes out: the kubelet's encoding is ours
    return call(request, timeout=timeout)


async def _call(
    channel: grpc.aio.Channel, method: str, request: bytes, timeout: float = REGISTRATION_TIMEOUT
) -> bytes:
    reply: bytes = await _start(channel, method, request, timeout)
    return reply


def chosen_service(info: PluginInfo) -> str:
    """The kubelet's choice: the first service the plugin names that the kubelet knows."""
    for service in info.supported_versions:
        if service in KUBELET_SERVICES:
            return service
    raise AssertionError(f"the kubelet knows none of {info.supported_versions}")


def dra_services(info: PluginInfo) -> list[str]:
    """The DRA services the plugin names that the kubelet knows (its health services
    apart)."""
    return [s for s in info.supported_versions if s in KUBELET_SERVICES]


async def get_info_on(channel: grpc.aio.Channel) -> PluginInfo:
    fields = wire.decode(await _call(channel, REGISTRATION + "GetInfo", b""))
    return PluginInfo(
        wire.string(fields, 1),
        wire.string(fields, 2),
        wire.string(fields, 3),
        wire.strings(fields, 4),
    )


async def get_info(socket_path: str) -> PluginInfo:
    async with connect(socket_path) as channel:
        return await get_info_on(channel)


async def notify_registration_status_on(
    channel: grpc.aio.Channel, registered: bool, error: str = ""
) -> None:
    request = wire.encode((1, registered), (2, error)) if error else wire.encode((1, registered))
    assert await _call(channel, REGISTRATION + "NotifyRegistrationStatus", request) == b""


async def notify_registration_status(socket_path: str, registered: bool, error: str = "") -> None:
    async with connect(socket_path) as channel:
        await notify_registration_status_on(channel, registered, error)


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


def _dra_method(service: str, name: str) -> str:
    return f"/{DRA_PACKAGES[service]}.DRAPlugin/{name}"


def start_prepare(
    channel: grpc.aio.Channel, service: str, claims: list[Claim]
) -> grpc.aio.UnaryUnaryCall[bytes, bytes]:
    """NodePrepareResources sent, its answer not awaited: the kubelet may drop the channel
    before it comes."""
    method = _dra_method(service, "NodePrepareResources")
    return _start(channel, method, _claims_request(claims), DRA_CALL_TIMEOUT)


async def prepare(endpoint: str, service: str, claims: list[Claim]) -> dict[str, str]:
    """NodePrepareResources: claim UID -> its error ("" for none)."""
    async with connect(endpoint) as channel:
        reply = await start_prepare(channel, service, claims)
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


async def prepare_devices_on(
    channel: grpc.aio.Channel, service: str, claims: list[Claim]
) -> dict[str, Prepared]:
    """NodePrepareResources: claim UID -> its devices (repeated Device devices = 1) and
    error (2)."""
    reply = await start_prepare(channel, service, claims)
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


async def prepare_devices(endpoint: str, service: str, claims: list[Claim]) -> dict[str, Prepared]:
    async with connect(endpoint) as channel:
        return await prepare_devices_on(channel, service, claims)


async def unprepare(endpoint: str, service: str, claims: list[Claim]) -> dict[str, str]:
    """NodeUnprepareResources: claim UID -> its error ("" for none)."""
    method = _dra_method(service, "NodeUnprepareResources")
    async with connect(endpoint) as channel:
        reply = await _call(channel, method, _claims_request(claims), DRA_CALL_TIMEOUT)
    return {uid: wire.string(result, 1) for uid, result in _by_uid(reply).items()}


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: str  # HEALTH's names
    last_updated: int  # Unix seconds
    timeout: int  # seconds
    message: str


class HealthStream:
    """NodeWatchResources, the stream the kubelet holds open for as long as it runs: each
    report by device name."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[bytes, bytes]) -> None:
        self._call = call

    async def next(self, within: float) -> dict[str, DeviceHealth]:
        reply = await asyncio.wait_for(self._call.read(), within)
        assert isinstance(reply, bytes), reply
        return health_report(reply)

    async def until(self, device: str, health: str, within: float) -> dict[str, DeviceHealth]:
        """The first report, within `within` s from now, in which `device` has `health`."""
        deadline = time.monotonic() + within
        while True:
            report = await self.next(deadline - time.monotonic())
            if device in report and report[device].health == health:
                return report


@contextlib.asynccontextmanager
async def watching_health(
    endpoint: str, service: str = HEALTH_SERVICES[0]
) -> AsyncIterator[HealthStream]:
    async with connect(endpoint) as channel:
        call = channel.unary_stream(f"/{service}/NodeWatchResources")(b"")
        try:
            yield HealthStream(call)
        finally:
            call.cancel()


def health_report(reply: bytes) -> dict[str, DeviceHealth]:
    """A NodeWatchResourcesResponse (repeated DeviceHealth devices = 1; in each, the
    DeviceIdentifier device = 1 (pool_name = 1, device_name = 2), health = 2,
    last_updated_time = 3, health_check_timeout_seconds = 4, message = 5), by device name."""
    out = {}
    for d in wire.messages(wire.decode(reply), 1):
        (ident,) = wire.messages(d, 1)
        out[wire.string(ident, 2)] = DeviceHealth(
            wire.string(ident, 1),
            wire.string(ident, 2),
            HEALTH[wire.integer(d, 2)],
            wire.integer(d, 3),
            wire.integer(d, 4),
            wire.string(d, 5),
        )
    return out
