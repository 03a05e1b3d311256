"""rdmad-dra: the command. Registers the driver with the kubelet, keeps the node's
ResourceSlices equal to what rdmad offers, and prepares claims by holding their devices in
rdmad; docs/kubernetes.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kubernetes.config.config_exception import ConfigException

from rdmad.bus.address import bus_address
from rdmad.bus.argtypes import add_bus_address
from rdmad.bus.client import Client
from rdmad.bus.connection import BusConnection
from rdmad.dra.call_lock import CallLock
from rdmad.dra.claim_status import ClaimStatus
from rdmad.dra.device_watch import DeviceWatch
from rdmad.dra.health import HealthReport
from rdmad.dra.kube import KubeClaimApi, KubeSliceApi, api_client
from rdmad.dra.node_service import dra_handlers
from rdmad.dra.offer import offered
from rdmad.dra.podcgroup import CGROUP2_MOUNT
from rdmad.dra.prepare import Preparer
from rdmad.dra.registration import POD_UID, Sockets, registration_handler, sockets
from rdmad.dra.rpc.unix_server import serving
from rdmad.dra.slices import SHARING, TAINT_EFFECTS, Pool, SlicePublisher, tainted

log = logging.getLogger("rdmad.dra")

DEFAULT_DRIVER = "rdma.rdmad.io"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
EXIT_FAILED = 1  # 2: a usage error, from argparse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rdmad-dra",
        description="rdmad's Kubernetes DRA kubelet plugin: publishes this node's RDMA "
        "devices (read from rdmad over D-Bus) as resource.k8s.io/v1 ResourceSlices, and "
        "prepares the claims allocated to them by holding the devices in rdmad for the pod.",
    )
    _node_arguments(p)
    add_bus_address(p)
    _driver_arguments(p)
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("no node name: give --node-name or set NODE_NAME")
    if args.pod_uid and not POD_UID.fullmatch(args.pod_uid):
        p.error(f"pod UID {args.pod_uid!r} is not a UUID")
    try:
        args.bus_address = bus_address(args.bus_address)
    except ValueError as e:
        p.error(str(e))
    return args


def _node_arguments(p: argparse.ArgumentParser) -> None:
    """Where the kubelet, the API server and this plugin's pod are."""
    p.add_argument(
        "--kubelet-registrar-directory-path",
        default=DEFAULT_REGISTRAR_DIR,
        metavar="DIR",
        help=f"the kubelet's plugin registration directory (default {DEFAULT_REGISTRAR_DIR})",
    )
    p.add_argument(
        "--kubelet-plugins-directory-path",
        default=DEFAULT_PLUGINS_DIR,
        metavar="DIR",
        help=f"where the plugin's DRA socket goes, under DIR/DRIVER "
        f"(default {DEFAULT_PLUGINS_DIR})",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig to reach the API server with (default: the pod's service account)",
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        metavar="NAME",
        help="this node's name in Kubernetes (default: $NODE_NAME)",
    )
    p.add_argument(
        "--pod-uid",
        default=os.environ.get("POD_UID", ""),
        metavar="UID",
        help="the UID of the plugin's pod (default: $POD_UID): given, the plugin's sockets "
        "are the pod's own, so that a new pod of the DaemonSet serves beside the old one "
        "during a rolling upgrade (Kubernetes 1.33 and later)",
    )


def _driver_arguments(p: argparse.ArgumentParser) -> None:
    """What the driver publishes, and how."""
    p.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER,
        metavar="NAME",
        help=f"the DRA driver's name, as DeviceClasses select it (default {DEFAULT_DRIVER})",
    )
    p.add_argument(
        "--cgroup-root",
        type=Path,
        default=CGROUP2_MOUNT,
        metavar="DIR",
        help=f"the host's cgroup2 mount, where the kubelet puts pods' cgroups "
        f"(default {CGROUP2_MOUNT})",
    )
    p.add_argument(
        "--sharing",
        choices=SHARING,
        default="auto",
        help="how share slots are published: as partitions of a counter set per device, "
        "which the whole device takes all of (counters: Kubernetes 1.36 and newer), or plain "
        "(slots: 1.34, 1.35); auto, the default: counters if the API server is 1.36 or newer",
    )
    p.add_argument(
        "--port-down-taint",
        choices=TAINT_EFFECTS,
        default=TAINT_EFFECTS[0],
        metavar="EFFECT",
        help="the effect of the taint on a device whose port is down: "
        f"{', '.join(TAINT_EFFECTS)}; None publishes no taint (default {TAINT_EFFECTS[0]})",
    )


async def follow_rdmad(
    watch: DeviceWatch, publisher: SlicePublisher, health: HealthReport, taint: str
) -> None:
    """Hand the publisher a new offer, and the health report rdmad's devices, after each
    signal that can change them."""
    stale = asyncio.Event()
    await watch.subscribe(stale.set)
    while True:
        state = await watch.read()
        publisher.offer(tainted(offered(state), state, taint) if state else [])
        health.update(state)
        await stale.wait()
        stale.clear()


@contextlib.asynccontextmanager
async def serving_the_kubelet(
    paths: Sockets,
    driver: str,
    preparer: Preparer,
    health: HealthReport,
    registered: Callable[[], None],
) -> AsyncIterator[None]:
    """The DRA and health services and the registration service on the instance's sockets
    while the context lasts; at its end (SIGTERM) the sockets are gone before the servers
    stop, so that none is left for the kubelet to dial or for the next instance to find."""
    # The DRA socket first: the kubelet connects to it as soon as it registers us.
    async with (
        serving(paths.endpoint, dra_handlers(preparer, CallLock(paths.lock), health)),
        serving(paths.registration, [registration_handler(driver, paths.endpoint, registered)]),
    ):
        yield


async def run(args: argparse.Namespace) -> int:
    api = api_client(args.kubeconfig)
    pool = Pool(
        KubeSliceApi(api), args.driver_name, args.node_name, args.sharing, args.port_down_taint
    )
    publisher = SlicePublisher(pool)
    bus = BusConnection(args.bus_address)
    await bus.connect()
    driver = args.driver_name
    claims = KubeClaimApi(api, driver)
    status = ClaimStatus(claims, Client(bus), driver)
    await status.follow()
    preparer = Preparer(claims, Client(bus), status, driver, args.node_name, args.cgroup_root)
    paths = sockets(
        args.kubelet_registrar_directory_path,
        args.kubelet_plugins_directory_path,
        driver,
        args.pod_uid,
    )
    health = HealthReport(args.node_name)  # the pool's name
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    work = [
        asyncio.ensure_future(publisher.run()),
        asyncio.ensure_future(
            follow_rdmad(DeviceWatch(bus), publisher, health, args.port_down_taint)
        ),
    ]
    stopped = asyncio.ensure_future(stop.wait())
    lost = asyncio.ensure_future(bus.wait_for_disconnect())
    try:
        async with serving_the_kubelet(paths, driver, preparer, health, publisher.recheck):
            log.info(
                "serving DRA driver %s for node %s: registration %s, DRA service %s; "
                "rdmad on bus %s",
                driver,
                args.node_name,
                paths.registration,
                paths.endpoint,
                args.bus_address,
            )
            done, _ = await asyncio.wait(
                [*work, stopped, lost], return_when=asyncio.FIRST_COMPLETED
            )
    finally:
        ours = [*work, stopped]
        for task in ours:
            task.cancel()
        for task in ours:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        bus.disconnect()
        # `lost` is left to end: after a loss (whichever task saw it first) with its cause,
        # else with None, by our disconnect.
        cause = await lost
    return _exit_code(stop.is_set(), cause, done)


def _exit_code(
    stopped: bool, cause: BaseException | None, done: Iterable[asyncio.Future[Any]]
) -> int:
    """0 for a stop asked for by a signal; else the plugin failed: say why."""
    if stopped:
        return 0
    if cause is not None:
        log.error("stopped: the bus closed the connection (%r)", cause)
        return EXIT_FAILED
    for ended in done:  # the plugin's work ends only by failing
        if not ended.cancelled() and ended.exception() is not None:
            log.error("stopped: %s", ended.exception())
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        return asyncio.run(run(args))
    except OSError as e:  # no bus, a socket path that cannot be served
        print(f"rdmad-dra: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ConfigException as e:  # no kubeconfig, not in a pod
        print(f"rdmad-dra: no API server to publish to: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
