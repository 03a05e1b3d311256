"""The kubelet's gRPC APIs that rdmad-dra serves: the messages of the .proto files in
rdmad/dra/rpc/proto, from the *_pb2 modules generated when the package is built
(scripts/gen-proto.sh). The .proto files are the one source of the wire contract; the
generated modules are not in git, and are imported by name: mypy reads none of them (the
messages are dynamic, typed Any).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import grpc

# The kubelet's names for what a plugin is and which DRA services it serves
# (k8s.io/kubelet pluginregistration/v1 DRAPlugin, dra/v1 and dra/v1beta1 DRAPluginService).
PLUGIN_TYPE = "DRAPlugin"
DRA_V1 = "v1.DRAPlugin"
DRA_V1BETA1 = "v1beta1.DRAPlugin"
SUPPORTED_VERSIONS = (DRA_V1, DRA_V1BETA1)  # newest first, as the kubelet picks

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


def unary_handler(service: str, methods: dict[str, tuple[Any, Any, Any]]) -> grpc.GenericRpcHandler:
    """A handler for `service`: method name -> (async function, request type, reply type)."""
    return grpc.method_handlers_generic_handler(
        service,
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=request.FromString,
                response_serializer=reply.SerializeToString,
            )
            for name, (fn, request, reply) in methods.items()
        },
    )
