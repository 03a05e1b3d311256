"""The kubelet's plugin registration service (pluginregistration.Registration) for a DRA
driver: what the kubelet's plugin watcher calls on <registry dir>/<driver>-reg.sock."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rdmad.dra.rpc import api
from rdmad.dra.rpc.api import registration as pb

log = logging.getLogger("rdmad.dra")


def registration_handler(
    driver: str, endpoint: str, registered: Callable[[], None]
) -> api.Servable:
    """GetInfo names the DRA service at `endpoint`; `registered` is called each time the
    kubelet says it registered the plugin (again after the kubelet restarts)."""

    async def get_info(_request: Any, _context: Any) -> Any:
        return pb.PluginInfo(
            type=api.PLUGIN_TYPE,
            name=driver,
            endpoint=endpoint,
            supported_versions=list(api.SUPPORTED_VERSIONS),
        )

    async def notify_registration_status(request: Any, _context: Any) -> Any:
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s (endpoint %s)", driver, endpoint)
            registered()
        else:
            log.error("the kubelet refused DRA driver %s: %s", driver, request.error)
        return pb.RegistrationStatusResponse()

    return api.unary_handler(
        api.REGISTRATION_SERVICE,
        {
            "GetInfo": (get_info, pb.InfoRequest, pb.PluginInfo),
            "NotifyRegistrationStatus": (
                notify_registration_status,
                pb.RegistrationStatus,
                pb.RegistrationStatusResponse,
            ),
        },
    )
