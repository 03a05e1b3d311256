"""The DRA node service (DRAPlugin, v1 and v1beta1) on <plugins dir>/<driver>/dra.sock.

Preparing a claim needs what rdmad does not have yet: a way to hold a device for a pod
before the pod's network namespace exists, and to attach it when the sandbox is made. Until
then every claim's prepare fails with an error that says so, in the pod's events. Unprepare
succeeds: nothing was ever prepared, so nothing is held, and an error would stop the
kubelet from finishing the pod's teardown.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import grpc

from rdmad.dra import grpc_api

log = logging.getLogger("rdmad.dra")

NOT_IMPLEMENTED = (
    "rdmad-dra cannot prepare claims yet: rdmad has no API to hold a device for a pod "
    "before the pod's network namespace exists, so driver {driver} only publishes "
    "ResourceSlices (docs/kubernetes.md)"
)


def _handler(driver: str, service: str, pb: ModuleType) -> grpc.GenericRpcHandler:
    refusal = NOT_IMPLEMENTED.format(driver=driver)

    async def prepare(request: Any, _context: Any) -> Any:
        for c in request.claims:
            log.warning("claim %s/%s (%s) not prepared: %s", c.namespace, c.name, c.uid, refusal)
        return pb.NodePrepareResourcesResponse(
            claims={c.uid: pb.NodePrepareResourceResponse(error=refusal) for c in request.claims}
        )

    async def unprepare(request: Any, _context: Any) -> Any:
        return pb.NodeUnprepareResourcesResponse(
            claims={c.uid: pb.NodeUnprepareResourceResponse() for c in request.claims}
        )

    return grpc_api.unary_handler(
        service,
        {
            "NodePrepareResources": (
                prepare,
                pb.NodePrepareResourcesRequest,
                pb.NodePrepareResourcesResponse,
            ),
            "NodeUnprepareResources": (
                unprepare,
                pb.NodeUnprepareResourcesRequest,
                pb.NodeUnprepareResourcesResponse,
            ),
        },
    )


def dra_handlers(driver: str) -> list[grpc.GenericRpcHandler]:
    """The DRA service under each version the plugin names in GetInfo."""
    return [
        _handler(driver, grpc_api.DRA_SERVICES[version], grpc_api.DRA_MESSAGES[version])
        for version in grpc_api.SUPPORTED_VERSIONS
    ]
