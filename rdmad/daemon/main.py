"""rdmad's entry point: wiring and start order, signal handling. Nothing else lives here.

Start order (each step needs the previous one):
 1. event sources subscribed (events queue up in the core);
 2. state loaded, kernel enumerated, claims reconciled (core.start: a claim whose give-back
    the kernel refuses stays listed as not-returned, and the start goes on, so that systemd
    never restarts rdmad into the same refusal; STATUS= says how many);
 3. objects exported, then the bus name taken (start_service);
 4. READY=1, and the watchdog if systemd asked for one.
SIGTERM: STOPPING=1 and a clean exit. Claims stay: they are kernel state, and the next
start picks them up from the state file.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from rdmad import __version__
from rdmad.bus.service import NameTaken, connect_bus, start_service
from rdmad.core import logfields
from rdmad.core.backend import EventSource, RdmaBackend
from rdmad.core.core import Core
from rdmad.core.store import Store
from rdmad.daemon import journal, systemd
from rdmad.daemon.cdi import CdiWriter
from rdmad.daemon.config import Config, ConfigError, load
from rdmad.daemon.eventlog import EventLog
from rdmad.errors import RdmadError
from rdmad.kernel.addr_events import AddrEventSource
from rdmad.kernel.cgroup import KernelCgroups
from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_events import RtnlEventSource
from rdmad.kernel.sim import SimRdma, parse_sim_devices
from rdmad.model import ClaimPhase
from rdmad.options import parse_netns_mode, parse_table_range

log = logging.getLogger("rdmad")

EXIT_CONFIG = 2
EXIT_BUS = 3


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = load(argv)
    except (ConfigError, ValueError) as exc:
        print(f"rdmad: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    journal.setup_logging(cfg.log_level)
    try:
        return asyncio.run(run(cfg))
    except KeyboardInterrupt:
        return 0


def _rdma_backend(cfg: Config, resolver: KernelNetnsResolver, rtnl: NlChannel) -> RdmaBackend:
    if cfg.sim_devices:
        log.warning("using the SIMULATED RDMA backend: %s", cfg.sim_devices)
        devices = parse_sim_devices(cfg.sim_devices)
        return SimRdma(devices, resolver, rtnl, parse_netns_mode(cfg.sim_mode))
    from rdmad.kernel.rdma import KernelRdma

    return KernelRdma(rtnl, init_netns_fd=resolver.init_fd)


def _event_sources(cfg: Config) -> list[EventSource]:
    from rdmad.kernel.udev import RdmaMonitorEvents, UdevEvents

    sources: list[EventSource] = [RtnlEventSource(), UdevEvents(), AddrEventSource()]
    if not cfg.sim_devices:
        sources.append(RdmaMonitorEvents())
    return sources


async def run(cfg: Config) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    resolver = KernelNetnsResolver()
    net = await RtnlBackend.create(resolver)
    rdma = _rdma_backend(cfg, resolver, net.channel)
    core = Core(
        net,
        rdma,
        resolver,
        Store(cfg.state_dir),
        cgroups=KernelCgroups(cfg.cgroup_root),
        shared_limit=cfg.shared_limit,
        route_tables=parse_table_range(cfg.route_tables),
    )
    sources = await _start_sources(cfg, core)
    await _start_core(cfg, core)
    try:
        bus = await connect_bus(cfg.bus_address or None)
        service = await start_service(bus, core, resolver)
    except (OSError, NameTaken, ConfigError, RdmadError) as exc:
        # RdmadError: the bus daemon refused a call of start's own (AddMatch)
        log.error("cannot serve on the bus: %s", exc)
        await _shutdown(core, sources, rdma, net)
        return EXIT_BUS
    core.announce_startup()
    disconnected = asyncio.ensure_future(bus.wait_for_disconnect())
    disconnected.add_done_callback(lambda _f: stop.set())
    _ready(core)
    watchdog = systemd.start_watchdog()
    await stop.wait()

    systemd.notify_stopping()
    logfields.log_event(log, logfields.MESSAGE_STOP, "rdmad stopping; claims stay in place")
    await systemd.stop_watchdog(watchdog)
    exit_code = 0
    if disconnected.done():
        log.error(
            "lost the bus connection (%r); exiting so that systemd restarts rdmad",
            disconnected.result(),
        )
        exit_code = EXIT_BUS
    else:
        await service.stop()
        bus.disconnect()
    await _shutdown(core, sources, rdma, net)
    return exit_code


async def _start_sources(cfg: Config, core: Core) -> list[EventSource]:
    """Start the kernel's event sources, feeding `core`: the ones that could start."""
    sources = _event_sources(cfg)
    for source in list(sources):
        try:
            await source.start(core.handle)
        except RdmadError as exc:
            # Optional sources (the RDMA netlink monitor) are missing on older kernels or
            # without ib_core; udev still reports RDMA devices coming and going.
            log.info("event source %s not used: %s", type(source).__name__, exc)
            sources.remove(source)
    return sources


async def _start_core(cfg: Config, core: Core) -> None:
    """Start the core, apply the configured mode, and attach its observers."""
    await core.start()
    if cfg.netns_mode:
        try:
            await core.set_netns_mode(parse_netns_mode(cfg.netns_mode))
        except RdmadError as exc:
            log.error("cannot apply netns_mode=%s at start: %s", cfg.netns_mode, exc)
    cdi = CdiWriter(cfg.cdi_dir, core.pod_of)
    # A not-returned claim is half given back: no runtime is to inject it. A held one's
    # spec is there for its pod's containers to name before the pod's netns exists.
    cdi.sync([c for c in core.claims() if c.phase in (ClaimPhase.ACTIVE, ClaimPhase.HELD)])
    core.add_observer(cdi)
    core.add_observer(EventLog())


def _ready(core: Core) -> None:
    """Serving: tell systemd and the journal."""
    # What start built (modules, the inventory, the bus's tables) lives as long as the
    # daemon. Frozen, it is out of the collector's reach: a full collection then scans only
    # what came since, instead of stalling a claim 9-18 ms (docs/performance.md).
    gc.freeze()
    status = f"serving {len(core.devices())} RDMA devices, {len(core.claims())} claims"
    # What went wrong at start (e.g. an unreadable state file) stays in `systemctl status`.
    systemd.notify_ready("; ".join([status, *core.startup_notes]))
    logfields.log_event(
        log,
        logfields.MESSAGE_START,
        f"rdmad {__version__} ready: netns mode {core.netns_mode.value}, "
        f"{len(core.devices())} devices, {len(core.claims())} claims",
    )


async def _shutdown(
    core: Core, sources: list[EventSource], rdma: RdmaBackend, net: RtnlBackend
) -> None:
    for source in sources:
        await source.stop()
    # A claim the kernel ended is given back to the end rather than cut off half-way (which
    # the next start would finish): only what waits for news from the kernel is cancelled.
    await core.quiesce()
    await core.close()
    await rdma.close()
    await net.close()


if __name__ == "__main__":
    sys.exit(main())
