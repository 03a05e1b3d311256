"""The services on <plugins dir>/<driver>/dra.sock: the DRA node service (DRAPlugin, v1 and
v1beta1), each claim of a call prepared or unprepared by rdmad/dra/prepare.py, on its own,
so that one claim's error is its own (the kubelet retries that claim, and shows the error
in its pod's events), under the lock that makes the instances of the plugin take turns
(rdmad/dra/call_lock.py); and the device health service (DRAResourceHealth, v1 and
v1alpha1), the stream of rdmad/dra/health.py's reports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

from rdmad.dra.allocation import Refused
from rdmad.dra.call_lock import CallLock
from rdmad.dra.health import TIMEOUT_S, HealthReport
from rdmad.dra.prepare import ClaimRef, Preparer
from rdmad.dra.rpc import api

log = logging.getLogger("rdmad.dra")


def _handler(preparer: Preparer, lock: CallLock, service: str, pb: ModuleType) -> api.Servable:
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
            await preparer.unprepare(ClaimRef(c.namespace, c.name, c.uid))
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


def _health_handler(report: HealthReport, service: str, pb: ModuleType) -> api.Servable:
    async def watch(_request: Any) -> AsyncIterator[Any]:
        async for devices in report.reports():
            now = report.now()
            yield pb.NodeWatchResourcesResponse(
                devices=[
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=report.pool, device_name=d.device),
                        health=int(d.health),
                        last_updated_time=now,
                        health_check_timeout_seconds=TIMEOUT_S,
                        message=d.message,
                    )
                    for d in devices
                ]
            )

    return api.stream_handler(
        service,
        "NodeWatchResources",
        watch,
        pb.NodeWatchResourcesRequest,
        pb.NodeWatchResourcesResponse,
    )


def dra_handlers(preparer: Preparer, lock: CallLock, report: HealthReport) -> list[api.Servable]:
    """The DRA and health services under each version the plugin names in GetInfo."""
    return [
        *(
            _handler(preparer, lock, api.DRA_SERVICES[version], api.DRA_MESSAGES[version])
            for version in api.DRA_VERSIONS
        ),
        *(
            _health_handler(report, version, api.HEALTH_MESSAGES[version])
            for version in api.HEALTH_VERSIONS
        ),
    ]
