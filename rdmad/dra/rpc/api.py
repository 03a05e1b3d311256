"""The kubelet's gRPC APIs that rdmad-dra serves: the messages of the .proto files in
rdmad/dra/rpc/proto, from the *_pb2 modules generated when the package is built
(scripts/gen-proto.sh). The .proto files are the one source of the wire contract; the
generated modules are not in git, and are imported by name: mypy reads none of them (the
messages are dynamic, typed Any).

They are served by grpclib, a gRPC server of asyncio alone: it wakes only for the calls
and streams it serves (docs/kubernetes.md, "Performance", measures it against grpcio's).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any

from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

# The kubelet's names for what a plugin is and which services it serves
# (k8s.io/kubelet pluginregistration/v1 DRAPlugin, dra/v1 and dra/v1beta1 DRAPluginService,
# dra-health/v1 and v1alpha1 DRAResourceHealthService).
PLUGIN_TYPE = "DRAPlugin"
DRA_V1 = "v1.DRAPlugin"
DRA_V1BETA1 = "v1beta1.DRAPlugin"
DRA_VERSIONS = (DRA_V1, DRA_V1BETA1)  # newest first, as the kubelet picks
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"  # what kubelets before 1.36 call
HEALTH_VERSIONS = (HEALTH_V1, HEALTH_V1ALPHA1)
SUPPORTED_VERSIONS = DRA_VERSIONS + HEALTH_VERSIONS  # GetInfo's: each one is served

REGISTRATION_SERVICE = "pluginregistration.Registration"
DRA_SERVICES = {
    DRA_V1: "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    DRA_V1BETA1: "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"rdmad.dra.rpc.proto.{name}_pb2")


registration = _load("pluginregistration")
dra_v1 = _load("dra_v1")
dra_v1beta1 = _load("dra_v1beta1")
DRA_MESSAGES = {DRA_V1: dra_v1, DRA_V1BETA1: dra_v1beta1}
HEALTH_MESSAGES = {HEALTH_V1: _load("health_v1"), HEALTH_V1ALPHA1: _load("health_v1alpha1")}

Unary = Callable[[Any, Stream[Any, Any]], Awaitable[Any]]
ServerStream = Callable[[Any], AsyncIterator[Any]]


class Servable:
    """A service as grpclib serves it: its methods by full route."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self._handlers = handlers

    def __mapping__(self) -> dict[str, Handler]:
        return self._handlers


def unary_handler(service: str, methods: dict[str, tuple[Unary, Any, Any]]) -> Servable:
    """A handler for `service`: method name -> (async function of the request and the
    call, request type, reply type)."""

    def handler(fn: Unary) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        async def call(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            await stream.send_message(await fn(request, stream))

        return call

    return Servable(
        {
            f"/{service}/{name}": Handler(handler(fn), Cardinality.UNARY_UNARY, request, reply)
            for name, (fn, request, reply) in methods.items()
        }
    )


def stream_handler(service: str, name: str, fn: ServerStream, request: Any, reply: Any) -> Servable:
    """A handler for `service` of one server-streaming method: `fn` yields its replies."""

    async def call(stream: Stream[Any, Any]) -> None:
        async for message in fn(await stream.recv_message()):
            await stream.send_message(message)

    return Servable({f"/{service}/{name}": Handler(call, Cardinality.UNARY_STREAM, request, reply)})
