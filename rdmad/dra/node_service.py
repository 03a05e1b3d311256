"""The DRA node service (DRAPlugin, v1 and v1beta1) on <plugins dir>/<driver>/dra.sock:
each claim of a call prepared or unprepared by rdmad/dra/prepare.py, on its own, so that
one claim's error is its own (the kubelet retries that claim, and shows the error in its
pod's events). A call runs under the lock that makes the instances of the plugin take
turns (rdmad/dra/call_lock.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

import grpc

from rdmad.dra.allocation import Refused
from rdmad.dra.call_lock import CallLock
from rdmad.dra.prepare import ClaimRef, Preparer
from rdmad.dra.rpc import api

log = logging.getLogger("rdmad.dra")


def _handler(
    preparer: Preparer, lock: CallLock, service: str, pb: ModuleType
) -> grpc.GenericRpcHandler:
    async def each(claims: Sequence[Any], one: Callable[[Any], Awaitable[Any]]) -> dict[str, Any]:
        """The claims' replies by UID, the claims handled together under the lock."""
        async with lock.held():
            replies = await asyncio.gather(*(one(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, replies, strict=True)}

    async def prepare_one(c: Any) -> Any:
        try:
            prepared = await preparer.prepare(ClaimRef(c.namespace, c.name, c.uid))
        except Refused as e:
            log.warning("claim %s/%s (%s) not prepared: %s", c.namespace, c.name, c.uid, e)
            return pb.NodePrepareResourceResponse(error=str(e))
        return pb.NodePrepareResourceResponse(
            devices=[
                pb.Device(
                    request_names=[p.request],
                    pool_name=p.pool,
                    device_name=p.device,
                    cdi_device_ids=[p.cdi_device_id],
                )
                for p in prepared
            ]
        )

    async def unprepare_one(c: Any) -> Any:
        try:
            await preparer.unprepare(c.uid)
        except Refused as e:
            log.warning("claim %s/%s (%s) not unprepared: %s", c.namespace, c.name, c.uid, e)
            return pb.NodeUnprepareResourceResponse(error=str(e))
        return pb.NodeUnprepareResourceResponse()

    async def prepare(request: Any, _context: Any) -> Any:
        return pb.NodePrepareResourcesResponse(claims=await each(request.claims, prepare_one))

    async def unprepare(request: Any, _context: Any) -> Any:
        return pb.NodeUnprepareResourcesResponse(claims=await each(request.claims, unprepare_one))

    return api.unary_handler(
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


def dra_handlers(preparer: Preparer, lock: CallLock) -> list[grpc.GenericRpcHandler]:
    """The DRA service under each version the plugin names in GetInfo."""
    return [
        _handler(preparer, lock, api.DRA_SERVICES[version], api.DRA_MESSAGES[version])
        for version in api.SUPPORTED_VERSIONS
    ]
