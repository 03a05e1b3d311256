"""The kubelet's plugin registration service (pluginregistration.Registration) for a DRA
driver, and where an instance of the plugin puts its sockets: <registry dir>/<driver>-reg.sock
and <plugins dir>/<driver>/dra.sock, or, in a rolling upgrade (the kubelet 1.33 and later
registers two instances of a driver at once), names of the instance's own, as
k8s.io/dynamic-resource-allocation's kubeletplugin names them for a pod UID."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdmad.dra.rpc import api
from rdmad.dra.rpc.api import registration as pb

log = logging.getLogger("rdmad.dra")

UNIX_PATH_MAX = 108  # sun_path's size, as kubeletplugin bounds the path
POD_UID = re.compile(r"[0-9A-Fa-f-]{1,64}")  # a UUID: nothing that could leave a directory
LOCK_FILE = "serialize.lock"  # the kubeletplugin's name, in the plugin's directory


@dataclass(frozen=True)
class Sockets:
    """Where one instance of the plugin serves: `registration`, the socket the kubelet's
    plugin watcher finds; `endpoint`, the DRA service's, which GetInfo names;
    `lock`, the file that serializes prepare and unprepare across the instances."""

    registration: str
    endpoint: str
    lock: str


def sockets(registry_dir: str, plugins_dir: str, driver: str, pod_uid: str) -> Sockets:
    """The instance's paths; with a `pod_uid`, each socket is
    the instance's own, so that two instances serve side by side; the lock is the driver's."""
    plugin_dir = os.path.join(plugins_dir, driver)
    suffix = f"-{pod_uid}" if pod_uid else ""
    registration = (
        registrar_socket_file(registry_dir, driver, pod_uid) if pod_uid else f"{driver}-reg.sock"
    )
    return Sockets(
        registration=os.path.join(registry_dir, registration),
        endpoint=os.path.join(plugin_dir, f"dra{suffix}.sock"),
        lock=os.path.join(plugin_dir, LOCK_FILE),
    )


def registrar_socket_file(registry_dir: str, driver: str, pod_uid: str) -> str:
    """The registration socket's name for a rolling upgrade: the first of
    <driver>-<pod UID>-reg.sock, <driver>-<hash of the UID>-reg.sock and
    dra-<hash of driver and UID>-reg.sock whose path fits in sun_path (kubeletplugin's
    RollingUpdateRegistrarSocketFile)."""
    uid_hash = _b64(hashlib.sha256(pod_uid.encode()).digest()[:8])
    both_hash = _b64(hashlib.sha256(f"{driver}\0{pod_uid}".encode()).digest()[:16])
    candidates = (
        f"{driver}-{pod_uid}-reg.sock",
        f"{driver}-{uid_hash}-reg.sock",
        f"dra-{both_hash}-reg.sock",
    )
    for name in candidates:
        if len(os.path.join(registry_dir, name).encode()) <= UNIX_PATH_MAX:
            return name
    return candidates[-1]


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


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
